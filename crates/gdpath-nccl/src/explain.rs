//! What NCCL chose for every peer pair, and why: the per-pair table, and findings in the
//! doctor's form ([`gdpath::finding::Finding`]) with the log lines as evidence and the basis of
//! their reason ([`Basis`]). The rules and their sources are in docs/nccl.md.

use crate::parse::Transport;
use crate::{Job, LineRef};
use gdpath::finding::{Area, Finding, FindingId, Status};
use gdpath_doctor::nccl::NcclLevel;
use gdpath_topo::text::escape;
use gdpath_topo::{Device, Machine};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Schema name of the JSON document (`gdpath nccl --json`).
pub const NCCL_SCHEMA: &str = "gdpath.nccl/1";

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
    #[serde(flatten)]
    pub finding: Finding,
    pub basis: Basis,
    pub reason: String,
    /// The first [`EVIDENCE_LINES`] lines that show it.
    pub lines: Vec<Evidence>,
    /// How many lines show it in all.
    pub line_count: usize,
}

/// One row of the per-pair table: a (source rank, destination rank, `via`) seen in the log.
#[derive(Debug, Clone, Serialize)]
pub struct PairRow {
    pub src: u32,
    pub dst: u32,
    pub via: String,
    /// `P2P`, `SHM`, `NET`, `CollNet`, `?`.
    pub class: &'static str,
    pub transport: Transport,
    /// Lines naming it (a `[send]` and a `[receive]` line of one connection count twice).
    pub lines: usize,
    /// Channels named, ascending.
    pub channels: Vec<u32>,
    /// Both ranks' hosts known: whether they are equal.
    pub same_host: Option<bool>,
    /// The topology's class of the two GPUs (`NV12`, `PIX`, `SYS`…), when a topology was given
    /// and both GPUs were found in it.
    pub topo_class: Option<String>,
    /// The first line.
    pub first: LineRef,
}

/// The explanation of one job.
#[derive(Debug, Clone, Serialize)]
pub struct Explanation {
    pub schema: &'static str,
    pub job: Job,
    pub pairs: Vec<PairRow>,
    pub findings: Vec<NcclFinding>,
    /// What topology the comparison used (`Source::describe`), if any.
    pub topology: Option<String>,
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

/// Builds the table and the findings; with `machine`, NCCL's choices are compared with what
/// the machine allows (reasons so found are marked [`Basis::Derived`]).
pub fn explain(job: Job, machine: Option<(&Machine, String)>) -> Explanation {
    let (machine, topology) = match machine {
        Some((m, d)) => (Some(m), Some(d)),
        None => (None, None),
    };
    let gpus: Vec<&Device> = machine.map(|m| m.gpus().collect()).unwrap_or_default();
    let gpu_of = |rank: u32| -> Option<&Device> {
        let info = job.ranks.get(&rank)?;
        if let Some(pci) = &info.pci {
            if let Some(d) = gpus.iter().find(|d| &d.pci.to_string() == pci) {
                return Some(d);
            }
        }
        // NVML numbers GPUs by PCI bus id, as the machine lists them.
        info.nvml_dev
            .or(info.cuda_dev)
            .and_then(|i| gpus.get(i as usize).copied())
    };
    let class_of = |a: u32, b: u32| -> Option<gdpath_topo::LinkClass> {
        let m = machine?;
        let (da, db) = (gpu_of(a)?, gpu_of(b)?);
        (da.pci != db.pci).then(|| m.classify(da, db))
    };

    let mut rows: BTreeMap<(u32, u32, String), PairRow> = BTreeMap::new();
    for c in &job.connections {
        let row = rows
            .entry((c.src, c.dst, c.via.clone()))
            .or_insert_with(|| PairRow {
                src: c.src,
                dst: c.dst,
                via: c.via.clone(),
                class: c.transport.class(),
                transport: c.transport.clone(),
                lines: 0,
                channels: Vec::new(),
                same_host: same_host(&job, c.src, c.dst),
                topo_class: class_of(c.src, c.dst).map(|k| k.to_string()),
                first: c.at.clone(),
            });
        row.lines += 1;
        if let Err(i) = row.channels.binary_search(&c.channel) {
            row.channels.insert(i, c.channel);
        }
    }
    let pairs: Vec<PairRow> = rows.into_values().collect();

    let mut f = Findings::default();
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
            env_line(k).into_iter().collect(),
        );
    }
    if is_one("NCCL_SHM_DISABLE") {
        f.push(
            "nccl.shm-disabled-by-env",
            Area::P2p,
            "job",
            Status::Degraded,
            Basis::Stated,
            "NCCL_SHM_DISABLE=1: pairs without P2P go through the network".into(),
            "unset NCCL_SHM_DISABLE".into(),
            env_line("NCCL_SHM_DISABLE").into_iter().collect(),
        );
    }
    if is_one("NCCL_IB_DISABLE") {
        f.push("nccl.ib-disabled-by-env", Area::Gdr, "job", Status::Degraded, Basis::Stated,
            "NCCL_IB_DISABLE=1: NCCL's IB/RoCE transport is off, so no GPUDirect RDMA; NCCL uses sockets (or a plugin)".into(),
            "unset NCCL_IB_DISABLE where the nodes have IB or RoCE NICs".into(),
            env_line("NCCL_IB_DISABLE").into_iter().collect());
    }
    if level_never("NCCL_NET_GDR_LEVEL") {
        f.push(
            "nccl.gdr-disabled-by-env",
            Area::Gdr,
            "job",
            Status::Degraded,
            Basis::Stated,
            "NCCL_NET_GDR_LEVEL names LOC: GPUDirect RDMA is never used".into(),
            "unset NCCL_NET_GDR_LEVEL (default PXB) or set it to the GPU↔NIC class".into(),
            env_line("NCCL_NET_GDR_LEVEL").into_iter().collect(),
        );
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
                .and_then(NcclLevel::of_class)
                .is_some_and(|l| l <= NcclLevel::Pxb);
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
        let subj = shm
            .iter()
            .map(|r| format!("{}->{}", r.src, r.dst))
            .collect::<Vec<_>>()
            .join(",");
        f.push_rows(
            "nccl.shm-fallback",
            Area::P2p,
            &subj,
            Status::Degraded,
            basis,
            format!("NCCL used shared host memory (SHM) between GPUs of a node: {reason}"),
            remedy,
            &shm,
            &job,
        );
    }

    // NET inside one host.
    let intra: Vec<&PairRow> = pairs
        .iter()
        .filter(|r| r.class == "NET" && r.same_host == Some(true))
        .collect();
    if !intra.is_empty() {
        let subj = intra
            .iter()
            .map(|r| format!("{}->{}", r.src, r.dst))
            .collect::<Vec<_>>()
            .join(",");
        f.push_rows("nccl.net-intra-node", Area::P2p, &subj, Status::Degraded, Basis::Derived,
            "NCCL used the network between ranks whose log lines name the same host (derived from the host names: two machines with one name would look the same); P2P and SHM were off or refused".into(),
            "check NCCL_P2P_DISABLE / NCCL_SHM_DISABLE and `gdpath p2p`; NET inside a node is the slowest path".into(), &intra, &job);
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
        let subj = if socket.is_empty() {
            "job".to_owned()
        } else {
            socket
                .iter()
                .map(|r| format!("{}->{}", r.src, r.dst))
                .collect::<Vec<_>>()
                .join(",")
        };
        let extra: Vec<LineRef> = Vec::new();
        f.push_rows_with("nccl.socket-fallback", Area::Gdr, &subj, Status::Degraded, basis,
            format!("NCCL moved data between nodes over TCP sockets through host memory: {reason}"),
            "use the nodes' RDMA NICs (IB/RoCE, or the EFA plugin on AWS): install rdma-core and the NCCL net plugin, check `ibv_devices`, unset NCCL_IB_DISABLE".into(),
            &socket, &job, extra);
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
        .filter(|g| !g.enabled && !g.at.text.contains("NET/Socket"))
        .collect();
    if !no_gdr.is_empty() || !disabled.is_empty() {
        let reasons: Vec<&str> = disabled
            .iter()
            .filter_map(|g| g.reason.as_deref())
            .collect();
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
        let subj = if no_gdr.is_empty() {
            "job".to_owned()
        } else {
            no_gdr
                .iter()
                .map(|r| format!("{}->{}", r.src, r.dst))
                .collect::<Vec<_>>()
                .join(",")
        };
        let mut extra: Vec<LineRef> = disabled.iter().map(|g| g.at.clone()).collect();
        extra.extend(job.nic_distance.iter().cloned());
        f.push_rows_with("nccl.gdr-off", Area::Gdr, &subj, Status::Degraded, basis,
            format!("NCCL's network transport ran without GPUDirect RDMA (through host bounce buffers): {reason}"),
            remedy, &no_gdr, &job, extra);
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

    Explanation {
        schema: NCCL_SCHEMA,
        topology,
        job,
        pairs,
        findings: f.0,
    }
}

fn same_host(job: &Job, a: u32, b: u32) -> Option<bool> {
    let ha = job.ranks.get(&a)?.host.as_ref()?;
    let hb = job.ranks.get(&b)?.host.as_ref()?;
    Some(ha == hb)
}

#[derive(Default)]
struct Findings(Vec<NcclFinding>);

impl Findings {
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
        lines: Vec<LineRef>,
    ) {
        let line_count = lines.len();
        let evidence = match lines.first() {
            Some(l) => format!("{} line(s), first at {}:{}", line_count, l.file, l.line),
            None => "no line (absence)".to_owned(),
        };
        self.0.push(NcclFinding {
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
            lines: lines.into_iter().take(EVIDENCE_LINES).collect(),
            line_count,
        });
    }

    #[allow(clippy::too_many_arguments)]
    fn push_rows(
        &mut self,
        id: &str,
        area: Area,
        subject: &str,
        status: Status,
        basis: Basis,
        reason: String,
        remedy: String,
        rows: &[&PairRow],
        job: &Job,
    ) {
        self.push_rows_with(
            id,
            area,
            subject,
            status,
            basis,
            reason,
            remedy,
            rows,
            job,
            Vec::new(),
        );
    }

    #[allow(clippy::too_many_arguments)]
    fn push_rows_with(
        &mut self,
        id: &str,
        area: Area,
        subject: &str,
        status: Status,
        basis: Basis,
        reason: String,
        remedy: String,
        rows: &[&PairRow],
        job: &Job,
        mut extra: Vec<LineRef>,
    ) {
        let keys: std::collections::BTreeSet<(u32, u32, &str)> = rows
            .iter()
            .map(|r| (r.src, r.dst, r.via.as_str()))
            .collect();
        let mut lines: Vec<LineRef> = job
            .connections
            .iter()
            .filter(|c| keys.contains(&(c.src, c.dst, c.via.as_str())))
            .map(|c| c.at.clone())
            .collect();
        extra.append(&mut lines);
        self.push(id, area, subject, status, basis, reason, remedy, extra);
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
    let _ = writeln!(s, "\nPairs ({}):", e.pairs.len());
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
            "  … {} more (--verbose lists all)",
            e.pairs.len() - shown
        );
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
