//! What NCCL chose for every peer pair, and why: the per-pair table, and findings in the
//! doctor's form ([`gdpath::finding::Finding`]) with the log lines as evidence and the basis of
//! their reason ([`Basis`]). The rules and their sources are in docs/nccl.md.

use crate::parse::Transport;
use crate::{Job, LineRef, SAMPLE_LINES};
use gdpath::finding::{ids, Area, Finding, FindingId, Status};
use gdpath_doctor::nccl::NcclLevel;
use gdpath_topo::text::escape;
use gdpath_topo::{Device, Machine};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Schema name of the JSON document (`gdpath nccl --json`).
pub const NCCL_SCHEMA: &str = "gdpath.nccl/2";

/// Pairs and connections in the document (`pairs`, `job.connections`); findings are made from
/// all of them, and the rest are counted (`pairs_more`, `connections_more`).
pub const MAX_SHOWN: usize = 4096;

/// Evidence lines kept per finding (the count of all is given).
const EVIDENCE_LINES: usize = 6;

/// Where a finding's reason comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Basis {
    /// NCCL's log says it (a reason in parentheses, an environment line, a refusal line).
    Stated,
    /// Inferred from the topology given (or from a distance the log printed), not said by NCCL.
    Derived,
    /// Neither says why; the remedy names what would tell.
    Unknown,
}

/// One line of evidence, as `file:line: text`.
pub type Evidence = LineRef;

/// A finding about the job: the doctor's finding, the basis and text of its reason, and its
/// log lines.
#[derive(Debug, Clone, Serialize)]
pub struct NcclFinding {
    /// The doctor's finding (id, severity, summary, evidence).
    #[serde(flatten)]
    pub finding: Finding,
    /// Where the reason comes from: stated by NCCL, derived, or unknown.
    pub basis: Basis,
    /// Why, in a sentence for the user.
    pub reason: String,
    /// The first lines that show it, at most 6 (`EVIDENCE_LINES`).
    pub lines: Vec<Evidence>,
    /// How many lines show it in all.
    pub line_count: usize,
}

/// One row of the per-pair table: a (source rank, destination rank, `via`) seen in the log.
#[derive(Debug, Clone, Serialize)]
pub struct PairRow {
    /// Sending rank.
    pub src: u32,
    /// Receiving rank.
    pub dst: u32,
    /// The text after `via`, trimmed.
    pub via: String,
    /// `P2P`, `SHM`, `NET`, `CollNet`, `?`.
    pub class: &'static str,
    /// The transport that text names.
    pub transport: Transport,
    /// Lines naming it (a `[send]` and a `[receive]` line of one connection count twice).
    pub lines: usize,
    /// Channels named, ascending; at most [`crate::MAX_CHANNELS`].
    pub channels: Vec<u32>,
    /// Whether both ranks are on one machine: always for P2P and SHM (NCCL uses them only
    /// there), else whether both ranks' hosts are known and equal.
    pub same_host: Option<bool>,
    /// The topology's class of the two GPUs (`NV12`, `PIX`, `SYS`…), when a topology was given
    /// and both GPUs were found in it.
    pub topo_class: Option<String>,
    /// The sending rank's GPU in the topology (`GPU0`), when `topo_class` is known and the
    /// pair is known to be of one machine (`same_host`): what a drawing of the machine marks.
    pub src_gpu: Option<String>,
    /// The receiving rank's GPU in the topology, under the same conditions as `src_gpu`.
    pub dst_gpu: Option<String>,
    /// The first lines naming it, at most [`SAMPLE_LINES`] in log order (`lines` counts all).
    pub samples: Vec<LineRef>,
    /// The first line.
    pub first: LineRef,
}

/// One rank's GPU and the NIC its `via NET/<net>/<dev>` lines name, as found in the topology
/// given. NCCL opens a connection's network resources on the rank that logs it (the sender of a
/// `[send]` line, the receiver of a `[receive]` line), except with PXN: a `[send] via
/// NET/<net>/<dev>(<proxy>)` line's NIC is opened by the proxy rank, whose GPU sits by it, and
/// the sender's data reaches that GPU over NVLink first (`transport/net.cc`).
#[derive(Debug, Clone, Serialize)]
pub struct NicPath {
    /// The rank whose GPU uses the NIC: the rank that logged the lines, or the PXN proxy.
    pub rank: u32,
    /// With PXN, the rank that logged the lines and whose data the proxy sends.
    pub pxn_for: Option<u32>,
    /// The GPU's id in the topology (`GPU0`).
    pub gpu: String,
    /// The network (`IB`, `AWS Libfabric`) and NCCL's device number of it.
    pub net: String,
    /// NCCL's device number on that network (`NET/IB/<N>`).
    pub dev: u32,
    /// The NIC's id in the topology (`NIC3`, `mlx5_3`).
    pub nic: String,
    /// The topology's class of GPU ↔ NIC (`PIX`, `SYS`…).
    pub class: String,
    /// Whether the line said `/GDRDMA`.
    pub gdr: bool,
    /// How NCCL's device number was matched to the NIC: `name` (the log's `NET/IB : Using
    /// [N]mlx5_N` line and the NIC's RDMA device name) or `order` (no such line: device N taken
    /// as the topology's N-th NIC in PCI order, an assumption said in every reason using it).
    pub matched: &'static str,
    /// The first line.
    pub first: LineRef,
}

/// A topology to compare NCCL's choices with: the machine and what the doctor finds of its GDR
/// peer memory (`gdr.peermem-missing`, `gdr.dmabuf-unavailable`) where the source has the files
/// (a snapshot or a sysfs tree; XML and `nvidia-smi` text have none, and say so).
pub struct Topology {
    /// The machine model read from the topology source.
    pub machine: Machine,
    /// `Source::describe` of where it was read.
    pub description: String,
    /// The doctor's findings on GDR peer memory for this source.
    pub gdr_facts: Vec<Finding>,
}

impl Topology {
    /// Reads `source` and runs the doctor's rules on it (no probe, nothing measured); errors are
    /// the topology readers'.
    pub fn load(source: &gdpath_topo::Source) -> Result<Topology, gdpath_topo::TopoError> {
        let loaded = gdpath_doctor::load(source)?;
        let report = gdpath_doctor::run(&gdpath_doctor::DoctorInput::new(
            &loaded.machine,
            &*loaded.view,
            loaded.mode.clone(),
        ));
        let gdr_facts = report
            .findings
            .into_iter()
            .filter(|f| {
                [ids::GDR_PEERMEM_MISSING, ids::GDR_DMABUF_UNAVAILABLE].contains(&f.id.0.as_str())
            })
            .collect();
        Ok(Topology {
            machine: loaded.machine,
            description: source.describe(),
            gdr_facts,
        })
    }

    /// A machine without doctor facts (tests, callers that have a machine only).
    pub fn new(machine: Machine, description: String) -> Topology {
        Topology {
            machine,
            description,
            gdr_facts: Vec::new(),
        }
    }
}

/// The explanation of one job.
#[derive(Debug, Clone, Serialize)]
pub struct Explanation {
    /// The document's schema id, [`NCCL_SCHEMA`].
    pub schema: &'static str,
    /// What the logs say about the job.
    pub job: Job,
    /// One row per (source rank, destination rank, `via`) seen, the first [`MAX_SHOWN`] in
    /// (source, destination, `via`) order.
    pub pairs: Vec<PairRow>,
    /// Pairs past the first [`MAX_SHOWN`], counted only.
    pub pairs_more: usize,
    /// Connections of `job.connections` past the first [`MAX_SHOWN`], counted only.
    pub connections_more: usize,
    /// Each rank's GPU ↔ NIC of its NET lines, when a topology was given (one row per rank,
    /// PXN sender, network, device and GDRDMA or not).
    pub nic_paths: Vec<NicPath>,
    /// Findings about the job, from the log and the topology if given.
    pub findings: Vec<NcclFinding>,
    /// What topology the comparison used (`Source::describe`), if any.
    pub topology: Option<String>,
    /// What the comparison assumed (one topology for every host; GPUs matched by NVML index).
    pub notes: Vec<String>,
}

impl Explanation {
    /// The finding ids, sorted and deduplicated.
    pub fn finding_ids(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .findings
            .iter()
            .map(|f| f.finding.id.0.clone())
            .collect();
        v.sort();
        v.dedup();
        v
    }
}

/// NCCL's path type of a topology class (`NODE` counts as NCCL's `PHB`).
fn level(class: gdpath_topo::LinkClass) -> Option<NcclLevel> {
    NcclLevel::of_class(class)
}

/// Within NCCL's default P2P and GDR level, PXB (`src/graph/paths.cc`).
fn within_pxb(class: gdpath_topo::LinkClass) -> bool {
    level(class).is_some_and(|l| l <= NcclLevel::Pxb)
}

/// Environment overrides that turn a transport off, stated by the log: (id, variable, area,
/// reason, remedy). `NCCL_NET_GDR_LEVEL` counts when it names `LOC`, the others when `1`.
const ENV_OFF: [(&str, &str, Area, &str, &str); 3] = [
    (
        "nccl.shm-disabled-by-env",
        "NCCL_SHM_DISABLE",
        Area::P2p,
        "NCCL_SHM_DISABLE=1: pairs without P2P go through the network",
        "unset NCCL_SHM_DISABLE",
    ),
    (
        "nccl.ib-disabled-by-env",
        "NCCL_IB_DISABLE",
        Area::Gdr,
        "NCCL_IB_DISABLE=1: NCCL's IB/RoCE transport is off, so no GPUDirect RDMA; NCCL uses sockets (or a plugin)",
        "unset NCCL_IB_DISABLE where the nodes have IB or RoCE NICs",
    ),
    (
        "nccl.gdr-disabled-by-env",
        "NCCL_NET_GDR_LEVEL",
        Area::Gdr,
        "NCCL_NET_GDR_LEVEL names LOC: GPUDirect RDMA is never used",
        "unset NCCL_NET_GDR_LEVEL (default PXB) or set it to the GPU↔NIC class",
    ),
];

/// Builds the table and the findings; with `topo`, NCCL's choices are compared with what
/// the machine allows (reasons so found are marked [`Basis::Derived`]). The one topology is
/// taken for every host of the job (a snapshot names no host), which `notes` says.
pub fn explain(mut job: Job, topo: Option<&Topology>) -> Explanation {
    let machine = topo.map(|t| &t.machine);
    let gpus: Vec<&Device> = machine.map(|m| m.gpus().collect()).unwrap_or_default();
    let mut notes: Vec<String> = Vec::new();
    let mut by_index = false;
    let gpu_of = |rank: u32, by_index: &mut bool| -> Option<&Device> {
        let info = job.ranks.get(&rank)?;
        if let Some(pci) = &info.pci {
            return gpus.iter().find(|d| &d.pci.to_string() == pci).copied();
        }
        // NVML numbers GPUs in PCI bus order (as `nvidia-smi` lists them), the order
        // `Machine::gpus` keeps; a cudaDev is the same number only with
        // CUDA_DEVICE_ORDER=PCI_BUS_ID and no CUDA_VISIBLE_DEVICES.
        let d = info
            .nvml_dev
            .or(info.cuda_dev)
            .and_then(|i| gpus.get(i as usize).copied());
        *by_index |= d.is_some();
        d
    };
    if let Some(t) = topo {
        if job.hosts.len() > 1 {
            notes.push(format!(
                "the topology ({}) is taken for every one of the job's {} hosts: comparisons of ranks on a host laid out otherwise are wrong",
                t.description,
                job.hosts.len()
            ));
        }
    }

    let mut rows: BTreeMap<(u32, u32, String), PairRow> = BTreeMap::new();
    for c in &job.connections {
        let Some(first) = c.first() else {
            continue;
        };
        let row = rows
            .entry((c.src, c.dst, c.via.clone()))
            .or_insert_with(|| {
                // NCCL's P2P and SHM transports join ranks of one machine only, whatever the
                // host names say (pods of one node have names of their own).
                let same = if matches!(c.transport, Transport::P2p { .. } | Transport::Shm { .. }) {
                    Some(true)
                } else {
                    same_host(&job, c.src, c.dst)
                };
                // Two GPUs of different hosts have no class in one machine's topology.
                let gpus = machine.filter(|_| same != Some(false)).and_then(|m| {
                    let (da, db) = (gpu_of(c.src, &mut by_index)?, gpu_of(c.dst, &mut by_index)?);
                    (da.pci != db.pci).then(|| (m.classify(da, db).to_string(), da, db))
                });
                PairRow {
                    src: c.src,
                    dst: c.dst,
                    via: c.via.clone(),
                    class: c.transport.class(),
                    transport: c.transport.clone(),
                    lines: 0,
                    channels: Vec::new(),
                    same_host: same,
                    src_gpu: gpus
                        .as_ref()
                        .filter(|_| same == Some(true))
                        .map(|(_, a, _)| a.id.clone()),
                    dst_gpu: gpus
                        .as_ref()
                        .filter(|_| same == Some(true))
                        .map(|(_, _, b)| b.id.clone()),
                    topo_class: gpus.map(|(k, _, _)| k),
                    samples: Vec::new(),
                    first: first.clone(),
                }
            });
        row.lines += c.lines as usize;
        for ch in &c.channels {
            crate::add_channel(&mut row.channels, *ch);
        }
        // A `[send]` and a `[receive]` connection of one pair: their samples in log order.
        row.samples.extend(c.samples.iter().cloned());
        row.samples.sort_by_key(|l| (l.file, l.line));
        row.samples.truncate(SAMPLE_LINES);
    }
    let pairs: Vec<PairRow> = rows.into_values().collect();

    // Each rank's GPU ↔ NIC of its NET lines.
    let mut nic_paths: BTreeMap<(u32, Option<u32>, String, u32, bool), NicPath> = BTreeMap::new();
    if let Some(m) = machine {
        for c in &job.connections {
            let Some(first) = c.first() else {
                continue;
            };
            let Transport::Net {
                net,
                dev: Some(dev),
                gdr,
                proxy,
                ..
            } = &c.transport
            else {
                continue;
            };
            // PXN: the proxy rank's GPU is the one beside the NIC.
            let pxn_for = proxy.filter(|p| *p != c.logger()).map(|_| c.logger());
            let user = proxy.unwrap_or(c.logger());
            let key = (user, pxn_for, net.clone(), *dev, *gdr);
            if net == "Socket" || nic_paths.contains_key(&key) || nic_paths.len() >= 4096 {
                continue;
            }
            let Some(gpu) = gpu_of(user, &mut by_index) else {
                continue;
            };
            let Some((nic, matched)) = nic_of(m, &job, net, *dev) else {
                continue;
            };
            nic_paths.insert(
                key,
                NicPath {
                    rank: user,
                    pxn_for,
                    gpu: gpu.id.clone(),
                    net: net.clone(),
                    dev: *dev,
                    nic: nic.id.clone(),
                    class: m.classify(gpu, nic).to_string(),
                    gdr: *gdr,
                    matched,
                    first: first.clone(),
                },
            );
        }
    }
    let nic_paths: Vec<NicPath> = nic_paths.into_values().collect();
    if by_index {
        notes.push("GPUs without a bus id in the log are matched by NVML index: the topology's GPUs in PCI bus order".into());
    }
    if nic_paths.iter().any(|p| p.matched == "order") {
        notes.push("NCCL's NET device numbers without a `NET/IB : Using [N]name` line are taken as the topology's NICs in PCI order".into());
    }

    let mut f = Findings {
        files: &job.files,
        list: Vec::new(),
    };
    let env = |k: &str| job.env.get(k);
    let env_line = |k: &str| job.env.get(k).map(|(_, l)| l.clone());
    let is_one = |k: &str| env(k).is_some_and(|(v, _)| v.trim() == "1");
    let level_never =
        |k: &str| env(k).is_some_and(|(v, _)| NcclLevel::parse(v) == Some(NcclLevel::Loc));

    // Environment overrides: stated by the log.
    if is_one("NCCL_P2P_DISABLE") || level_never("NCCL_P2P_LEVEL") {
        let k = if is_one("NCCL_P2P_DISABLE") {
            "NCCL_P2P_DISABLE"
        } else {
            "NCCL_P2P_LEVEL"
        };
        f.push(
            "nccl.p2p-disabled-by-env",
            Area::P2p,
            "job",
            Status::Degraded,
            Basis::Stated,
            format!(
                "{k}={} turns NCCL's P2P transport off: GPUs of a node talk through SHM or NET",
                env(k).map(|v| v.0.as_str()).unwrap_or("")
            ),
            format!("unset {k} (NCCL then applies its default P2P level, PXB)"),
            env_line(k).into_iter().collect::<Vec<_>>(),
        );
    }
    for (id, k, area, reason, remedy) in ENV_OFF {
        let off = if k == "NCCL_NET_GDR_LEVEL" {
            level_never(k)
        } else {
            is_one(k)
        };
        if off {
            f.push(
                id,
                area,
                "job",
                Status::Degraded,
                Basis::Stated,
                reason.into(),
                remedy.into(),
                env_line(k).into_iter().collect::<Vec<_>>(),
            );
        }
    }

    // P2P refused by NCCL's check (CUDA peer access or NVML P2P status).
    if !job.p2p_refused.is_empty() {
        let lines: Vec<LineRef> = job.p2p_refused.iter().map(|(_, _, l)| l.clone()).collect();
        let mut pairs_named: Vec<String> = job
            .p2p_refused
            .iter()
            .map(|(a, b, _)| format!("GPU{a}-GPU{b}"))
            .collect();
        pairs_named.sort();
        pairs_named.dedup();
        f.push("nccl.p2p-unavailable", Area::P2p, &pairs_named.join(","), Status::Unavailable, Basis::Stated,
            "NCCL's P2P check refused these GPU pairs: CUDA reports no peer access between them (cuDeviceCanAccessPeer = 0, or NVML's P2P status is not OK), so NCCL uses SHM or NET".into(),
            "run `gdpath p2p` and `gdpath doctor` on the node: ACS, IOMMU, a GPU without P2P (GeForce), or a VM without P2P are the usual causes".into(),
            lines);
    }

    // SHM where NCCL could have used P2P.
    let shm: Vec<&PairRow> = pairs.iter().filter(|r| r.class == "SHM").collect();
    if !shm.is_empty() {
        let (basis, reason, remedy) = if is_one("NCCL_P2P_DISABLE")
            || env("NCCL_P2P_LEVEL").is_some()
        {
            (Basis::Stated, "NCCL's P2P transport was limited by the environment (see nccl.p2p-disabled-by-env / NCCL_P2P_LEVEL)".to_owned(), "unset NCCL_P2P_DISABLE / NCCL_P2P_LEVEL".to_owned())
        } else if !job.p2p_refused.is_empty() {
            (
                Basis::Stated,
                "NCCL's P2P check refused the pair (nccl.p2p-unavailable)".to_owned(),
                "make CUDA P2P work between the GPUs (`gdpath doctor`)".to_owned(),
            )
        } else if let Some((r, k)) = shm
            .iter()
            .find_map(|r| r.topo_class.as_ref().map(|k| (r, k)))
        {
            let allowed = k
                .parse::<gdpath_topo::LinkClass>()
                .ok()
                .is_some_and(within_pxb);
            if allowed {
                (Basis::Derived, format!("rank {} ↔ {} is {k} in the topology, within NCCL's default P2P level PXB: P2P was possible, so CUDA refused it (peer access, ACS, IOMMU, virtualisation) or NCCL's P2P level was lowered", r.src, r.dst),
                 "run `gdpath doctor` and `gdpath p2p` on the node; set NCCL_DEBUG_SUBSYS=INIT,P2P,ENV to see NCCL's P2P check".to_owned())
            } else {
                (Basis::Derived, format!("rank {} ↔ {} is {k} in the topology, beyond NCCL's default P2P level PXB (NCCL's default on AMD hosts with at most two GPUs is SYS)", r.src, r.dst),
                 "expected on this topology; NCCL_P2P_LEVEL=SYS allows P2P across the CPU if `gdpath p2p` shows it works and is faster".to_owned())
            }
        } else {
            (Basis::Unknown, "the log does not say why P2P was not used".to_owned(),
             "give the node's topology (--snapshot / --sysfs-root / --smi-topo) or rerun with NCCL_DEBUG_SUBSYS=INIT,P2P,ENV; `gdpath p2p` shows whether CUDA allows P2P".to_owned())
        };
        f.push(
            "nccl.shm-fallback",
            Area::P2p,
            &pair_subject(&shm),
            Status::Degraded,
            basis,
            format!("NCCL used shared host memory (SHM) between GPUs of a node: {reason}"),
            remedy,
            row_lines(&shm),
        );
    }

    // NET inside one host.
    let intra: Vec<&PairRow> = pairs
        .iter()
        .filter(|r| r.class == "NET" && r.same_host == Some(true))
        .collect();
    if !intra.is_empty() {
        f.push("nccl.net-intra-node", Area::P2p, &pair_subject(&intra), Status::Degraded, Basis::Derived,
            "NCCL used the network between ranks whose log lines name the same host (derived from the host names: two machines with one name would look the same); P2P and SHM were off or refused".into(),
            "check NCCL_P2P_DISABLE / NCCL_SHM_DISABLE and `gdpath p2p`; NET inside a node is the slowest path".into(), row_lines(&intra));
    }

    // Sockets.
    let socket: Vec<&PairRow> = pairs
        .iter()
        .filter(|r| matches!(&r.transport, Transport::Net { net, .. } if net == "Socket"))
        .collect();
    if !socket.is_empty() || job.networks.contains("Socket") {
        let (basis, reason) = if is_one("NCCL_IB_DISABLE") {
            (
                Basis::Stated,
                "NCCL_IB_DISABLE=1 (nccl.ib-disabled-by-env)".to_owned(),
            )
        } else {
            (Basis::Unknown, "NCCL found no IB/RoCE device or plugin it could use (look for `NET/IB : No device found` and `NET/Plugin` lines)".to_owned())
        };
        f.push("nccl.socket-fallback", Area::Gdr, &pair_subject(&socket), Status::Degraded, basis,
            format!("NCCL moved data between nodes over TCP sockets through host memory: {reason}"),
            "use the nodes' RDMA NICs (IB/RoCE, or the EFA plugin on AWS): install rdma-core and the NCCL net plugin, check `ibv_devices`, unset NCCL_IB_DISABLE".into(),
            row_lines(&socket));
    }

    // A NIC across the CPU while one under the GPU's PCIe switch exists.
    if let Some(m) = machine {
        let far: Vec<(&NicPath, &Device)> = nic_paths
            .iter()
            .filter(|p| {
                p.class
                    .parse::<gdpath_topo::LinkClass>()
                    .is_ok_and(|c| !within_pxb(c))
            })
            .filter_map(|p| {
                let gpu = m.by_id(&p.gpu)?;
                let near = m.nics().find(|n| within_pxb(m.classify(gpu, n)))?;
                Some((p, near))
            })
            .collect();
        if !far.is_empty() {
            let (p, near) = far[0];
            let near_class = m.classify(m.by_id(&p.gpu).unwrap_or(near), near);
            let subject = far
                .iter()
                .map(|(p, _)| format!("rank {} {}↔{}", p.rank, p.gpu, p.nic))
                .collect::<Vec<_>>()
                .join(",");
            f.push("nccl.net-sys-nic", Area::Gdr, &subject, Status::Degraded, Basis::Derived,
                format!("rank {}'s {} sends or receives through {} (NET/{}/{}), which is {} to it in the topology, while {} is {near_class} to it: the traffic crosses the CPU{}{}",
                    p.rank, p.gpu, p.nic, p.net, p.dev, p.class, near.id,
                    if far.len() > 1 { format!(" ({} rank↔NIC pairs in all)", far.len()) } else { String::new() },
                    if p.matched == "order" { "; assumed: the log lists no NCCL device names, so NET device N is taken as the topology's N-th NIC" } else { "" }),
                "check that the near NIC is up and listed by `ibv_devices`, that NCCL_IB_HCA does not leave it out and NCCL_CROSS_NIC is unset; with rail-optimised networks PXN (NCCL_PXN_DISABLE unset) moves the data over NVLink to the GPU beside the NIC".into(),
                far.iter().map(|(p, _)| p.first.clone()).collect::<Vec<_>>());
        }
    }

    // GPUDirect RDMA off: NET (not Socket) without GDRDMA, or a Disabled line.
    let no_gdr: Vec<&PairRow> = pairs
        .iter()
        .filter(
            |r| matches!(&r.transport, Transport::Net { net, gdr: false, .. } if net != "Socket"),
        )
        .collect();
    let disabled: Vec<&crate::GdrDecision> = job
        .gdr
        .iter()
        .filter(|g| !g.enabled && g.net.as_deref() != Some("Socket"))
        .collect();
    if !no_gdr.is_empty() || !disabled.is_empty() {
        let reasons: Vec<&str> = disabled
            .iter()
            .filter_map(|g| g.reason.as_deref())
            .collect();
        let near_no_gdr = nic_paths.iter().find(|p| {
            !p.gdr
                && p.class
                    .parse::<gdpath_topo::LinkClass>()
                    .is_ok_and(within_pxb)
        });
        let far_no_gdr = nic_paths.iter().find(|p| !p.gdr);
        let (basis, reason, remedy) = if level_never("NCCL_NET_GDR_LEVEL") {
            (
                Basis::Stated,
                "NCCL_NET_GDR_LEVEL names LOC".to_owned(),
                "unset NCCL_NET_GDR_LEVEL".to_owned(),
            )
        } else if reasons.iter().any(|r| r.contains("no module")) {
            (Basis::Stated, "NCCL says \"no module\": neither nvidia_peermem (nv_peer_mem) is loaded nor dma-buf usable".to_owned(),
             "load nvidia_peermem (`modprobe nvidia_peermem`), or use dma-buf (kernel ≥ 5.12, open GPU kernel modules); `gdpath doctor` checks both".to_owned())
        } else if let Some(r) = reasons.iter().find(|r| r.contains("distance")) {
            (Basis::Stated, format!("NCCL says \"{r}\": the GPU and the NIC are farther apart than NCCL's GDR level (path types: 1 PIX, 2 PXB, 3 PHB, 4 SYS in 2.4–2.7; later versions count LOC, NVL, NVB first)"),
             "put the job's GPUs next to their NICs, or set NCCL_NET_GDR_LEVEL to the GPU↔NIC class if GDR through the CPU is faster (measure)".to_owned())
        } else if let Some(p) = near_no_gdr {
            (Basis::Derived, format!("rank {}'s {} and {} (NET/{}/{}) are {} in the topology, within NCCL's default GDR level PXB, so NCCL would have used GDR had the NIC been able to register GPU memory: {}{}",
                p.rank, p.gpu, p.nic, p.net, p.dev, p.class, peer_memory_facts(topo),
                if p.matched == "order" { "; assumed: NET device N is the topology's N-th NIC" } else { "" }),
             "load nvidia_peermem (`modprobe nvidia_peermem`) or use dma-buf (kernel ≥ 5.12, open GPU kernel modules); check NCCL_NET_GDR_LEVEL and that the NCCL net plugin supports GDR; `gdpath doctor` on the node".to_owned())
        } else if let Some(p) = far_no_gdr {
            (Basis::Derived, format!("rank {}'s {} and {} (NET/{}/{}) are {} in the topology, beyond NCCL's default GDR level PXB{}",
                p.rank, p.gpu, p.nic, p.net, p.dev, p.class,
                if p.matched == "order" { "; assumed: NET device N is the topology's N-th NIC" } else { "" }),
             "put the job's GPUs next to their NICs, or set NCCL_NET_GDR_LEVEL to the GPU↔NIC class if GDR through the CPU is faster (measure)".to_owned())
        } else if !job.nic_distance.is_empty()
            && job
                .nic_distance
                .iter()
                .any(|l| l.text.trim_end().ends_with("SYS") || l.text.trim_end().ends_with("PHB"))
        {
            (Basis::Derived, "the log's `NIC distance` lines put the NIC at PHB or SYS from the GPU, beyond NCCL's default GDR level (PXB)".to_owned(),
             "place GPUs and NICs under one PCIe switch, or raise NCCL_NET_GDR_LEVEL if measured faster".to_owned())
        } else {
            (Basis::Unknown, "NCCL gave no reason (it logs the per-GPU decision only at TRACE level)".to_owned(),
             "run `gdpath doctor` on the node (nvidia_peermem, dma-buf, GPU↔NIC class) or give its topology; NCCL_DEBUG_SUBSYS=INIT,NET shows the per-HCA lines".to_owned())
        };
        let mut lines: Vec<LineRef> = disabled.iter().map(|g| g.at.clone()).collect();
        lines.extend(job.nic_distance.iter().cloned());
        let lines = Proof::from(lines).and(row_lines(&no_gdr));
        f.push("nccl.gdr-off", Area::Gdr, &pair_subject(&no_gdr), Status::Degraded, basis,
            format!("NCCL's network transport ran without GPUDirect RDMA (through host bounce buffers): {reason}"),
            remedy, lines);
    }

    if !job.conflicts.is_empty() {
        let named: Vec<String> = job
            .conflicts
            .iter()
            .take(8)
            .map(|c| {
                format!(
                    "rank {} {} {} ({}, kept) and {} (line {})",
                    c.rank,
                    c.what,
                    c.kept,
                    c.first
                        .map(|l| format!("line {}", l.line))
                        .unwrap_or_else(|| "first line".into()),
                    c.other,
                    c.at.line
                )
            })
            .collect();
        let mut ranks: Vec<u32> = job.conflicts.iter().map(|c| c.rank).collect();
        ranks.sort_unstable();
        ranks.dedup();
        let ranks: Vec<String> = ranks.iter().map(u32::to_string).collect();
        f.push("nccl.rank-gpu-conflict", Area::System, &format!("rank {}", ranks.join(",")), Status::Unknown, Basis::Stated,
            format!("the log is inconsistent: it gives a rank two different GPUs, and the first is used: {}{}",
                named.join("; "),
                if job.conflicts.len() > named.len() { format!("; {} conflict(s) in all", job.conflicts.len()) } else { String::new() }),
            "give the log of one job and one communicator (lines of several runs or jobs mixed in one file, or a corrupted log, give one rank two GPUs)".into(),
            job.conflicts.iter().map(|c| c.at.clone()).collect::<Vec<_>>());
    }

    if job.connections.is_empty() {
        f.push("nccl.no-transport-lines", Area::System, "job", Status::Unknown, Basis::Unknown,
            "the log has no `Channel … via` or `Ring … via` line: the transports NCCL chose are unknown".into(),
            "log a whole init with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,GRAPH,NET,P2P,SHM,ENV (or `gdpath nccl run -- CMD`)".into(),
            Vec::new());
    }
    if !job.truncated.is_empty() {
        f.push(
            "nccl.log-truncated",
            Area::System,
            "job",
            Status::Unknown,
            Basis::Stated,
            format!("reading stopped at a limit: {}", job.truncated.join("; ")),
            "give the log of fewer ranks or of the init only".into(),
            Vec::new(),
        );
    }

    let findings = f.list;
    let mut pairs = pairs;
    let pairs_more = pairs.len().saturating_sub(MAX_SHOWN);
    pairs.truncate(MAX_SHOWN);
    let connections_more = job.connections.len().saturating_sub(MAX_SHOWN);
    job.connections.truncate(MAX_SHOWN);
    Explanation {
        schema: NCCL_SCHEMA,
        topology: topo.map(|t| t.description.clone()),
        job,
        pairs,
        pairs_more,
        connections_more,
        nic_paths,
        findings,
        notes,
    }
}

/// The NIC behind NCCL's device `dev` of network `net`: by the RDMA device name the log's
/// `NET/IB : Using` line gives it, else (no such line) the topology's `dev`-th NIC in PCI order.
fn nic_of<'m>(
    m: &'m Machine,
    job: &Job,
    net: &str,
    dev: u32,
) -> Option<(&'m Device, &'static str)> {
    // HPC-X's `IBext` plugins are NCCL's IB code and print the same `NET/IB : Using` line.
    if net.starts_with("IB") {
        if let Some((name, _)) = job.ib_devices.get(&dev) {
            // A name the topology does not have matches nothing: no guess by order then.
            return m
                .nics()
                .find(|n| n.rdma.iter().any(|r| r == name))
                .map(|n| (n, "name"));
        }
    }
    m.nics().nth(dev as usize).map(|n| (n, "order"))
}

/// What the doctor found of GDR's peer memory in the topology's source, in a sentence.
fn peer_memory_facts(topo: Option<&Topology>) -> String {
    let facts: Vec<String> = topo
        .map(|t| {
            t.gdr_facts
                .iter()
                .map(|f| format!("{} is {:?} ({})", f.id, f.status, f.evidence))
                .collect()
        })
        .unwrap_or_default();
    if facts.is_empty() {
        "the topology source does not say whether nvidia_peermem is loaded or dma-buf usable (a snapshot or --sysfs-root does)".into()
    } else {
        format!("the doctor on the topology's source: {}", facts.join("; "))
    }
}

/// A finding's subject for pair rows: `src->dst,…`, or `job` when there is none.
fn pair_subject(rows: &[&PairRow]) -> String {
    if rows.is_empty() {
        return "job".to_owned();
    }
    rows.iter()
        .map(|r| format!("{}->{}", r.src, r.dst))
        .collect::<Vec<_>>()
        .join(",")
}

/// A finding's lines: the first [`EVIDENCE_LINES`] kept, and how many show it in all.
struct Proof {
    lines: Vec<LineRef>,
    count: usize,
}

impl From<Vec<LineRef>> for Proof {
    fn from(mut lines: Vec<LineRef>) -> Proof {
        let count = lines.len();
        lines.truncate(EVIDENCE_LINES);
        Proof { lines, count }
    }
}

impl Proof {
    /// `self`'s lines, then `more`'s.
    fn and(mut self, more: Proof) -> Proof {
        self.lines.extend(more.lines);
        self.lines.truncate(EVIDENCE_LINES);
        self.count += more.count;
        self
    }
}

/// The rows' first lines in log order (from their samples, of which the first
/// [`EVIDENCE_LINES`] over all rows are always kept), and the count of all their lines.
fn row_lines(rows: &[&PairRow]) -> Proof {
    let mut lines: Vec<LineRef> = Vec::new();
    for r in rows {
        lines.extend(r.samples.iter().cloned());
        lines.sort_by_key(|l| (l.file, l.line));
        lines.truncate(EVIDENCE_LINES);
    }
    Proof {
        lines,
        count: rows.iter().map(|r| r.lines).sum(),
    }
}

fn same_host(job: &Job, a: u32, b: u32) -> Option<bool> {
    let ha = job.ranks.get(&a)?.host.as_ref()?;
    let hb = job.ranks.get(&b)?.host.as_ref()?;
    Some(ha == hb)
}

/// The findings being built, with the log files' names for their evidence.
struct Findings<'j> {
    files: &'j [String],
    list: Vec<NcclFinding>,
}

impl Findings<'_> {
    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        id: &str,
        area: Area,
        subject: &str,
        status: Status,
        basis: Basis,
        reason: String,
        remedy: String,
        lines: impl Into<Proof>,
    ) {
        let Proof {
            lines,
            count: line_count,
        } = lines.into();
        // The evidence names the log file as given (escaped: a path is untrusted text).
        let evidence = match lines.first() {
            Some(l) => format!(
                "{} line(s), first at {}:{}",
                line_count,
                self.files.get(l.file).map(escape).unwrap_or_default(),
                l.line
            ),
            None => "no line (absence)".to_owned(),
        };
        self.list.push(NcclFinding {
            finding: Finding {
                id: FindingId::from(id),
                path: area,
                subject: subject.chars().take(200).collect(),
                status,
                evidence,
                remedy,
            },
            basis,
            reason,
            lines,
            line_count,
        });
    }
}

/// The explanation as text for a terminal, in the doctor's style; every text from the log is
/// escaped (`gdpath_text::escape`).
pub fn render_text(e: &Explanation, verbose: bool) -> String {
    let j = &e.job;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "NCCL job ({} file(s), {} lines, {} bytes read)",
        j.files.len(),
        j.lines_read,
        j.bytes_read
    );
    let _ = writeln!(
        s,
        "  version   {}",
        j.version
            .as_deref()
            .map(escape)
            .unwrap_or_else(|| "not logged".into())
    );
    let _ = writeln!(
        s,
        "  ranks     {} seen{}",
        j.ranks.len(),
        j.nranks.map(|n| format!(" of {n}")).unwrap_or_default()
    );
    let hosts: Vec<String> = j.hosts.iter().take(16).map(escape).collect();
    let _ = writeln!(
        s,
        "  hosts     {}{}",
        hosts.join(" "),
        if j.hosts.len() > 16 {
            format!(" … ({} in all)", j.hosts.len())
        } else {
            String::new()
        }
    );
    let nets: Vec<String> = j.networks.iter().map(escape).collect();
    let _ = writeln!(
        s,
        "  networks  {}",
        if nets.is_empty() {
            "none logged".into()
        } else {
            nets.join(", ")
        }
    );
    if let Some(t) = &e.topology {
        let _ = writeln!(s, "  topology  {}", escape(t));
    }
    for n in &e.notes {
        let _ = writeln!(s, "  note      {}", escape(n));
    }
    if verbose {
        for (r, i) in &j.ranks {
            let _ = writeln!(
                s,
                "  rank {r:<5} host {} cudaDev {} nvmlDev {} pci {}",
                i.host.as_deref().map(escape).unwrap_or_else(|| "?".into()),
                i.cuda_dev
                    .map(|d| d.to_string())
                    .unwrap_or_else(|| "?".into()),
                i.nvml_dev
                    .map(|d| d.to_string())
                    .unwrap_or_else(|| "?".into()),
                i.pci.as_deref().unwrap_or("?")
            );
        }
    }
    let _ = writeln!(s, "\nPairs ({}):", e.pairs.len() + e.pairs_more);
    let _ = writeln!(
        s,
        "  {:>6} {:>6}  {:<5} {:<28} {:>5}  {:<6} topology",
        "src", "dst", "class", "via", "lines", "host"
    );
    let shown = if verbose {
        e.pairs.len()
    } else {
        e.pairs.len().min(64)
    };
    for r in &e.pairs[..shown] {
        let host = match r.same_host {
            Some(true) => "same",
            Some(false) => "other",
            None => "?",
        };
        let _ = writeln!(
            s,
            "  {:>6} {:>6}  {:<5} {:<28} {:>5}  {:<6} {}",
            r.src,
            r.dst,
            r.class,
            escape(&r.via),
            r.lines,
            host,
            r.topo_class.as_deref().unwrap_or("-")
        );
    }
    if shown < e.pairs.len() {
        let _ = writeln!(
            s,
            "  … {} more (--verbose lists {})",
            e.pairs.len() + e.pairs_more - shown,
            e.pairs.len()
        );
    } else if e.pairs_more > 0 {
        let _ = writeln!(
            s,
            "  … {} more past the first {MAX_SHOWN} (counted, not listed)",
            e.pairs_more
        );
    }
    if !e.nic_paths.is_empty() {
        let _ = writeln!(s, "\nGPU ↔ NIC of NET lines ({}):", e.nic_paths.len());
        for p in &e.nic_paths {
            let _ = writeln!(
                s,
                "  rank {:<5} {:<8} NET/{}/{:<3} {:<10} {:<5} {} (matched by {}){}",
                p.rank,
                escape(&p.gpu),
                escape(&p.net),
                p.dev,
                escape(&p.nic),
                p.class,
                if p.gdr { "GDRDMA" } else { "no GDRDMA" },
                p.matched,
                p.pxn_for
                    .map(|r| format!(", PXN proxy for rank {r}"))
                    .unwrap_or_default()
            );
        }
    }
    let _ = writeln!(s, "\nFindings ({}):", e.findings.len());
    for f in &e.findings {
        let basis = match f.basis {
            Basis::Stated => "stated",
            Basis::Derived => "derived",
            Basis::Unknown => "unknown",
        };
        let _ = writeln!(
            s,
            "  [{:?}] {} ({}): {}",
            f.finding.status,
            f.finding.id,
            escape(&f.finding.subject),
            escape(&f.reason)
        );
        let _ = writeln!(
            s,
            "      reason: {basis}; remedy: {}",
            escape(&f.finding.remedy)
        );
        let n = if verbose {
            f.lines.len()
        } else {
            f.lines.len().min(2)
        };
        for l in &f.lines[..n] {
            let name = j.files.get(l.file).map(escape).unwrap_or_default();
            let text: String = l.text.chars().take(200).collect();
            let _ = writeln!(s, "      {}:{}: {}", name, l.line, escape(&text));
        }
        if f.line_count > n {
            let _ = writeln!(s, "      … {} line(s) in all", f.line_count);
        }
    }
    s
}
