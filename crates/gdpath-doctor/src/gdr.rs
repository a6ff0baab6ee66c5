//! GDR checks: RDMA devices, peer memory (nvidia_peermem or dma-buf), CUDA's GDR attribute,
//! BAR1, GPU↔NIC class and links, UCX.

use super::nccl::{self, NcclLevel};
use super::{bytes, finding, kernel_release, kernel_version, module_loaded, DoctorInput, Gathered};
use gdpath::finding::{ids, Area, Finding, Status};
use gdpath_topo::facts::GpuFacts;
use gdpath_topo::{Device, DeviceKind, LinkClass, Machine, PcieLink, SysView};

const A: Area = Area::Gdr;

/// Peer-memory modules: NVIDIA's in-driver `nvidia_peermem` (driver ≥ 470) and the older
/// out-of-tree `nv_peer_mem`.
const PEERMEM_MODULES: [&str; 2] = ["nvidia_peermem", "nv_peer_mem"];

pub(super) fn check(input: &DoctorInput) -> Vec<Finding> {
    let mut out = vec![rdma_devices(input)];
    if let Some(f) = super::no_gpu(input, A) {
        out.push(f);
    }
    let modules = PeermemModules::read(input);
    let dmabuf = dmabuf(input, &modules);
    out.extend(peermem(input, &modules, &dmabuf));
    out.push(dmabuf.finding);
    out.push(ucx(input));
    let m = input.machine;
    let rdma_nics = rdma_nics(m, input.view);
    // Each GPU's nearest RDMA NIC (PCIe class, then PCI order), worked out once per group of
    // GPUs that sit alike in the tree (their classes to every NIC are the same).
    let nic_places: Vec<gdpath_topo::Place> = rdma_nics.iter().map(|n| m.place(n)).collect();
    let mut nearest_by_tree = std::collections::HashMap::new();
    for g in m.gpus() {
        let gf = input
            .driver
            .got()
            .and_then(|f| f.gpu_by_pci(&g.pci.to_string()));
        out.push(cuda_attr(input, g, gf));
        out.push(bar1(input, g, gf));
        out.push(link(m, g, gf));
        let gp = m.place(g);
        let pick = || {
            nic_places
                .iter()
                .enumerate()
                .min_by_key(|(_, np)| (m.pair_at(&gp, np).pcie, np.device().pci))
                .map(|(i, np)| (i, m.pair_at(&gp, np).pcie))
        };
        let near = match m.tree_key(&gp) {
            Some(k) => *nearest_by_tree.entry(k).or_insert_with(pick),
            None => pick(),
        };
        if let Some((i, class)) = near {
            let nic = rdma_nics[i];
            out.push(nic_far(input, g, nic, class));
            let s = format!("{}-{}", g.id, nic_name(nic));
            let acs = super::p2p::acs_of(m, &gp, &nic_places[i], false, true);
            out.push(super::p2p::acs_finding(m, &acs, A, &s, None));
        }
    }
    for nic in &rdma_nics {
        out.push(link(m, nic, None));
    }
    out
}

/// The NICs the GDR checks judge: those with an RDMA device. Sources without class devices
/// (hwloc or NCCL XML) may name no RDMA device even for an InfiniBand NIC: there, the NICs that
/// are RDMA-capable by PCI identity. A NIC nothing marks as RDMA-capable (e.g. the Ethernet NIC
/// NCCL marks gdr="0" on Azure NC A100 v4) gets no GPU↔NIC verdict: GDR-level advice would not
/// apply.
pub(crate) fn rdma_nics<'m>(m: &'m Machine, view: &dyn SysView) -> Vec<&'m Device> {
    let rdma: Vec<&Device> = m.nics().filter(|n| !n.rdma.is_empty()).collect();
    if rdma.is_empty() && view.read_dir("/sys/class").is_err() {
        return m
            .nics()
            .filter(|n| n.rdma_capable_by_id().is_some())
            .collect();
    }
    rdma
}

/// The GPU's nearest NIC among `nics`: nearest PCIe class, then PCI order.
pub(crate) fn nearest_nic<'m>(m: &Machine, g: &Device, nics: &[&'m Device]) -> Option<&'m Device> {
    nics.iter()
        .min_by_key(|n| (m.pcie_class(g, n), n.pci))
        .copied()
}

fn nic_name(n: &Device) -> String {
    format!("{} ({})", n.id, n.os_name())
}

fn rdma_devices(input: &DoctorInput) -> Finding {
    let id = ids::GDR_NO_RDMA_DEVICE;
    let m = input.machine;
    let on_pci: Vec<String> = m
        .nics()
        .filter(|n| !n.rdma.is_empty())
        .map(|n| format!("{} on {} {}", n.rdma.join(","), n.id, n.pci))
        .collect();
    if !on_pci.is_empty() {
        return finding(
            id,
            A,
            "system",
            Status::Ok,
            format!(
                "RDMA devices (/sys/class/infiniband): {}",
                on_pci.join("; ")
            ),
            "",
        );
    }
    let remedy = "GPUDirect RDMA needs an RDMA-capable NIC (InfiniBand, RoCE, EFA) with its \
                  driver loaded (`ibv_devices` lists them); without one, remote transfers use \
                  TCP through host memory";
    match input.view.read_dir("/sys/class/infiniband") {
        Ok(names) if names.is_empty() => finding(
            id,
            A,
            "system",
            Status::Unavailable,
            "/sys/class/infiniband is empty",
            remedy,
        ),
        Ok(names) => finding(
            id,
            A,
            "system",
            Status::Unavailable,
            format!(
                "/sys/class/infiniband lists {} but none sits on a PCI NIC (software or \
                 coprocessor devices)",
                names.join(", ")
            ),
            remedy,
        ),
        Err(_) if input.view.read_dir("/sys/class").is_ok() => finding(
            id,
            A,
            "system",
            Status::Unavailable,
            "/sys/class/infiniband absent (no RDMA driver loaded)",
            remedy,
        ),
        Err(_) => {
            // A file source (hwloc/NCCL XML): no RDMA device names, but the NICs' PCI identity
            // may still say they are InfiniBand, RoCE or EFA adapters.
            let by_id: Vec<String> = m
                .nics()
                .filter_map(|n| {
                    n.rdma_capable_by_id()
                        .map(|why| format!("{} {} ({why})", n.id, n.pci))
                })
                .collect();
            // An NCCL dump also says, per network device, whether NCCL found GPUDirect RDMA
            // through it when the file was written (`<net gdr>`).
            let nccl_says = |g: bool| -> Vec<String> {
                m.nics()
                    .filter(|n| n.nccl_gdr == Some(g))
                    .map(|n| format!("{} on {}", n.interface_names().join(","), n.id))
                    .collect()
            };
            let (yes, no) = (nccl_says(true), nccl_says(false));
            if by_id.is_empty() && !yes.is_empty() {
                return finding(
                    id,
                    A,
                    "system",
                    Status::Ok,
                    format!(
                        "the source ({}) marks {} gdr=1: NCCL read and wrote GPU memory through \
                         it when the file was written",
                        m.source,
                        yes.join("; ")
                    ),
                    "",
                );
            }
            if by_id.is_empty() && !no.is_empty() && no.len() == m.nics().count() {
                return finding(
                    id,
                    A,
                    "system",
                    Status::Unavailable,
                    format!(
                        "the source ({}) marks every network device gdr=0 ({}): NCCL found no \
                         NIC that can read or write GPU memory",
                        m.source,
                        no.join("; ")
                    ),
                    remedy,
                );
            }
            let evidence = if by_id.is_empty() {
                format!(
                    "the source ({}) names no RDMA device, no NIC is RDMA-capable by its PCI \
                     identity, and it has no /sys/class to tell",
                    m.source
                )
            } else {
                format!(
                    "{} RDMA-capable by PCI identity, but the source ({}) names no RDMA device \
                     and no driver; {}",
                    crate::plural(by_id.len(), "NIC is", "NICs are"),
                    m.source,
                    by_id.join("; ")
                )
            };
            finding(
                id,
                A,
                "system",
                Status::Unknown,
                evidence,
                crate::read_the_machine("/sys/class/infiniband lists its RDMA devices"),
            )
        }
    }
}

/// The dma-buf path's verdict, kept for the peer-memory check.
struct Dmabuf {
    available: Option<bool>,
    finding: Finding,
}

/// Whether a peer-memory module is loaded, the other GDR route beside dma-buf.
struct PeermemModules {
    /// The first of [`PEERMEM_MODULES`] found loaded.
    loaded: Option<&'static str>,
    /// Whether the source says which modules are loaded at all.
    known: bool,
    /// What was read, each distinct sentence once.
    evidence: String,
}

impl PeermemModules {
    fn read(input: &DoctorInput) -> PeermemModules {
        let mut loaded = None;
        let mut ev: Vec<String> = Vec::new();
        let mut known = false;
        for m in PEERMEM_MODULES {
            let (l, e) = module_loaded(input, m);
            // "not readable" is the same sentence for every module: say it once.
            if !ev.contains(&e) {
                ev.push(e);
            }
            known |= l.is_some();
            if l == Some(true) && loaded.is_none() {
                loaded = Some(m);
            }
        }
        PeermemModules {
            loaded,
            known,
            evidence: ev.join("; "),
        }
    }
}

/// dma-buf GDR: kernel ≥ 5.12 (RDMA dma-buf import, `ib_umem_dmabuf`), CUDA's
/// `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED` on the GPUs, rdma-core with `ibv_reg_dmabuf_mr`.
/// The finding speaks for GDR, which has a second route (a peer-memory module): a dma-buf
/// path that is ruled out makes it `unavailable` only when no peer-memory module is loaded,
/// `unknown` when the source does not say (a replay without `/sys/module`), `ok` when one is.
fn dmabuf(input: &DoctorInput, modules: &PeermemModules) -> Dmabuf {
    let id = ids::GDR_DMABUF_UNAVAILABLE;
    // What rules the path out, what is not known, what is in place: said in that order.
    let mut ev = Vec::new();
    let mut missing = Vec::new();
    let mut unknowns: Vec<String> = Vec::new();
    match kernel_release(input) {
        Some((r, file)) => match kernel_version(&r) {
            Some(v) if v >= (5, 12) => ev.push(format!("kernel {r} ≥ 5.12 ({file})")),
            Some(_) => missing.push(format!("kernel {r} < 5.12 ({file})")),
            None => unknowns.push(format!("kernel release \"{r}\" not understood ({file})")),
        },
        None => {
            unknowns.push("kernel release unknown (/proc/sys/kernel/osrelease absent)".to_owned())
        }
    }
    let gpus: Vec<&Device> = input.machine.gpus().collect();
    match input.driver.got() {
        Some(f) => {
            for g in &gpus {
                match f
                    .gpu_by_pci(&g.pci.to_string())
                    .and_then(|x| x.dma_buf_supported)
                {
                    Some(true) => {
                        ev.push(format!("{} CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED 1", g.id))
                    }
                    Some(false) => {
                        missing.push(format!("{} CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED 0", g.id))
                    }
                    None => unknowns.push(format!("{} dma-buf attribute not known", g.id)),
                }
            }
        }
        None => unknowns.push(input.missing_evidence("CUDA dma-buf attribute")),
    }
    match &input.rdma_core {
        Gathered::Got(r) if r.has_reg_dmabuf_mr => ev.push(format!(
            "{} exports ibv_reg_dmabuf_mr",
            r.library.as_deref().unwrap_or("libibverbs")
        )),
        Gathered::Got(r) => missing.push(match &r.library {
            Some(l) => format!("{l} lacks ibv_reg_dmabuf_mr (rdma-core < 34)"),
            None => "libibverbs not found (rdma-core not installed)".to_owned(),
        }),
        Gathered::Failed(e) => missing.push(format!("libibverbs: {e}")),
        Gathered::Missing => unknowns.push(input.missing_evidence("rdma-core (libibverbs)")),
    }
    let (available, status) = if !missing.is_empty() {
        let status = match (modules.loaded, modules.known) {
            (Some(_), _) => Status::Ok,
            (None, true) => Status::Unavailable,
            (None, false) => Status::Unknown,
        };
        (Some(false), status)
    } else if !unknowns.is_empty() {
        (
            None,
            if input.is_replay() && input.driver.got().is_none() {
                Status::NotRun
            } else {
                Status::Unknown
            },
        )
    } else {
        (Some(true), Status::Ok)
    };
    let mut all = missing.clone();
    all.extend(unknowns);
    all.extend(ev);
    let mut evidence = all.join("; ");
    if !missing.is_empty() {
        // Ruled out: what it means for GDR is the peer-memory route's to say.
        evidence = match modules.loaded {
            Some(m) => format!(
                "not needed: {m} is loaded (gdr.peermem-missing); the dma-buf path is ruled \
                 out: {evidence}"
            ),
            None if modules.known => {
                format!("{evidence}; no peer-memory module is loaded either (gdr.peermem-missing)")
            }
            None => format!(
                "whether nvidia_peermem, GDR's other route, is loaded is not known ({}); the \
                 dma-buf path is ruled out: {evidence}",
                modules.evidence
            ),
        };
    }
    let remedy = if status == Status::Ok || modules.loaded.is_some() {
        String::new()
    } else if missing.is_empty() {
        input.missing_remedy().to_owned()
    } else {
        "dma-buf GDR needs Linux ≥ 5.12, NVIDIA's open kernel modules (driver ≥ 515) on a GPU \
         that reports the dma-buf attribute, and rdma-core ≥ 34; otherwise load nvidia_peermem"
            .to_owned()
    };
    Dmabuf {
        available,
        finding: finding(id, A, "system", status, evidence, remedy),
    }
}

fn peermem(input: &DoctorInput, modules: &PeermemModules, dmabuf: &Dmabuf) -> Vec<Finding> {
    let mut out = Vec::new();
    let (loaded, known, ev) = (modules.loaded, modules.known, &modules.evidence);
    let id = ids::GDR_PEERMEM_MISSING;
    out.push(match (loaded, known, dmabuf.available) {
        (Some(m), _, _) => finding(
            id,
            A,
            "system",
            Status::Ok,
            format!("{m} loaded ({ev})"),
            "",
        ),
        (None, true, Some(true)) => finding(
            id,
            A,
            "system",
            Status::Ok,
            format!(
                "no peer-memory module, but the dma-buf path is available \
                 (gdr.dmabuf-unavailable ok); {ev}"
            ),
            "",
        ),
        (None, true, Some(false)) => finding(
            id,
            A,
            "system",
            Status::Unavailable,
            format!(
                "no peer-memory module loaded and no dma-buf path (see \
                 gdr.dmabuf-unavailable); {ev}"
            ),
            "`modprobe nvidia_peermem` (shipped with the NVIDIA driver ≥ 470; needs an \
             ib_core with peer-memory support, e.g. MLNX_OFED/DOCA-OFED), or meet the dma-buf \
             requirements",
        ),
        (None, true, None) => finding(
            id,
            A,
            "system",
            Status::Unknown,
            format!(
                "no peer-memory module loaded, and whether the dma-buf path works is unknown; \
                 {ev}"
            ),
            "`modprobe nvidia_peermem`, unless the dma-buf path is in use",
        ),
        (None, false, _) => finding(
            id,
            A,
            "system",
            Status::Unknown,
            format!("whether nvidia_peermem or nv_peer_mem is loaded is not known: {ev}"),
            crate::read_the_machine("/sys/module shows the loaded kernel modules"),
        ),
    });
    if let Some(m) = loaded {
        let id = ids::GDR_PEERMEM_UNREGISTERED;
        let peers = input.view.read_dir("/sys/kernel/mm/memory_peers");
        out.push(match peers {
            Ok(p) if !p.is_empty() => finding(
                id,
                A,
                "system",
                Status::Ok,
                format!(
                    "{m} loaded; /sys/kernel/mm/memory_peers lists {}",
                    p.join(", ")
                ),
                "",
            ),
            _ => finding(
                id,
                A,
                "system",
                Status::Unavailable,
                format!(
                    "{m} loaded but /sys/kernel/mm/memory_peers is {}: no peer-memory client is \
                     registered with ib_core",
                    if peers.is_ok() { "empty" } else { "absent" }
                ),
                "the running ib_core has no peer-memory interface (inbox kernel RDMA stack): \
                 install MLNX_OFED/DOCA-OFED and reload nvidia_peermem, or use the dma-buf path",
            ),
        });
    }
    out
}

fn ucx(input: &DoctorInput) -> Finding {
    let id = ids::GDR_UCX_NO_CUDA;
    match &input.ucx {
        Gathered::Got(u) => {
            let cuda_tl: Vec<&str> = u
                .transports
                .iter()
                .map(String::as_str)
                .filter(|t| t.starts_with("cuda") || *t == "gdr_copy")
                .collect();
            let v = u.version.as_deref().unwrap_or("?");
            let has = u.cuda_support.unwrap_or(!cuda_tl.is_empty());
            if has {
                finding(
                    id,
                    A,
                    "system",
                    Status::Ok,
                    format!("UCX {v}: CUDA transports {}", cuda_tl.join(", ")),
                    "",
                )
            } else {
                finding(
                    id,
                    A,
                    "system",
                    Status::Degraded,
                    format!(
                        "UCX {v} transports: {} (no cuda_copy/cuda_ipc/gdr_copy)",
                        u.transports.join(", ")
                    ),
                    "this UCX was built without CUDA: GPU memory goes through pinned staging \
                     buffers; use a UCX built --with-cuda (e.g. the libucx-cu12/cu13 wheels or \
                     HPC-X)",
                )
            }
        }
        Gathered::Failed(e) => finding(
            id,
            A,
            "system",
            Status::Unavailable,
            format!("UCX could not be loaded: {e}"),
            "install UCX (libucp.so.0), with CUDA support for GPU memory",
        ),
        Gathered::Missing => finding(
            id,
            A,
            "system",
            input.missing_status(),
            input.missing_evidence("UCX transports"),
            input.missing_remedy(),
        ),
    }
}

fn cuda_attr(input: &DoctorInput, g: &Device, gf: Option<&GpuFacts>) -> Finding {
    let id = ids::GDR_CUDA_UNSUPPORTED;
    match gf.map(|f| f.gdr_supported) {
        Some(Some(true)) => finding(
            id,
            A,
            &g.id,
            Status::Ok,
            "CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED 1",
            "",
        ),
        Some(Some(false)) => finding(
            id,
            A,
            &g.id,
            Status::Unavailable,
            "CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED 0",
            "this GPU (or its driver/virtualisation mode) does not support GPUDirect RDMA: use \
             a data-centre GPU with a driver that supports it",
        ),
        Some(None) => finding(
            id,
            A,
            &g.id,
            Status::Unknown,
            "CUDA GPUDirect RDMA attribute not in the driver facts",
            crate::RECAPTURE,
        ),
        None => finding(
            id,
            A,
            &g.id,
            input.missing_status(),
            input.missing_evidence("CUDA GPUDirect RDMA attribute"),
            input.missing_remedy(),
        ),
    }
}

fn bar1(input: &DoctorInput, g: &Device, gf: Option<&GpuFacts>) -> Finding {
    let id = ids::GDR_BAR1_SMALL;
    let Some(f) = gf else {
        return finding(
            id,
            A,
            &g.id,
            input.missing_status(),
            input.missing_evidence("NVML BAR1 size"),
            input.missing_remedy(),
        );
    };
    let Some(total) = f.bar1_total_bytes else {
        return finding(
            id,
            A,
            &g.id,
            Status::Unknown,
            "NVML BAR1 size not in the driver facts",
            crate::RECAPTURE,
        );
    };
    let used = f
        .bar1_used_bytes
        .map(|u| format!(", {} used", bytes(u)))
        .unwrap_or_default();
    let ev = format!(
        "BAR1 {}{used} for {} of GPU memory (nvmlDeviceGetBAR1MemoryInfo)",
        bytes(total),
        bytes(f.memory_bytes)
    );
    if f.memory_bytes == 0 || total >= f.memory_bytes {
        finding(id, A, &g.id, Status::Ok, ev, "")
    } else {
        finding(
            id,
            A,
            &g.id,
            Status::Degraded,
            format!(
                "{ev}: at most {} of GPU memory can be registered for GDR at a time",
                bytes(total)
            ),
            "GPUDirect RDMA maps registered GPU memory through BAR1: enable Resizable BAR / \
             \"Above 4G decoding\" in the BIOS (and `nvidia-smi -q -d BAR1` to verify), or keep \
             registered GPU buffers within the BAR1 size",
        )
    }
}

fn link(m: &gdpath_topo::Machine, d: &Device, gf: Option<&GpuFacts>) -> Finding {
    let id = ids::GDR_LINK_DEGRADED;
    let subject = if d.kind == DeviceKind::Nic {
        nic_name(d)
    } else {
        d.id.clone()
    };
    // sysfs first; NVML's generation and width for a GPU when sysfs has none.
    let mut l = d.link;
    let mut src = format!(
        "/sys/bus/pci/devices/{}/{{current,max}}_link_{{speed,width}}",
        d.pci
    );
    if l.cur_gts.is_none() || l.max_gts.is_none() {
        if let Some(p) = gf.and_then(|f| f.pcie) {
            let gts = |g: u32| {
                [2.5, 5.0, 8.0, 16.0, 32.0, 64.0, 128.0]
                    .get(g.wrapping_sub(1) as usize)
                    .copied()
            };
            l = PcieLink {
                cur_gts: gts(p.cur_gen),
                max_gts: gts(p.max_gen),
                cur_width: Some(p.cur_width).filter(|w| *w > 0),
                max_width: Some(p.max_width).filter(|w| *w > 0),
                ..PcieLink::default()
            };
            src = "NVML nvmlDeviceGetCurrPcieLinkGeneration/Width and Max".to_owned();
        }
    }
    let side = |gts: Option<f64>, w: Option<u32>| {
        format!(
            "{} x{}",
            gts.and_then(PcieLink::gen_of)
                .map_or("Gen?".to_owned(), |g| format!("Gen{g}")),
            w.map_or("?".to_owned(), |w| w.to_string())
        )
    };
    let cur = side(l.cur_gts, l.cur_width);
    let max = side(l.max_gts, l.max_width);
    let bw = match (l.limit_gbps(), l.max_limit_gbps()) {
        (Some(c), Some(m)) => format!(", {c:.2} of {m:.2} GB/s per direction"),
        _ => String::new(),
    };
    let ev = format!("trained {cur} of {max}{bw} ({src})");
    if l.cur_gts.is_none() && l.cur_width.is_none() {
        return finding(
            id,
            A,
            subject,
            Status::Unknown,
            format!(
                "current link speed and width not in the source; {}",
                m.coverage.link_state.gap().unwrap_or(&src)
            ),
            if matches!(m.source.as_str(), "live" | "sysfs-root" | "snapshot") {
                // The machine's own sysfs had no link files: virtual devices or an old kernel.
                "read the link's LnkSta (`lspci -vv`) where the device is physical: on the host \
                 of a virtual machine"
                    .to_owned()
            } else {
                crate::read_the_machine("sysfs gives each link's trained speed and width")
            },
        );
    }
    if !l.is_degraded() {
        return finding(id, A, subject, Status::Ok, ev, "");
    }
    if d.kind == DeviceKind::Gpu && l.speed_degraded() && !l.width_degraded() {
        return finding(
            id,
            A,
            subject,
            Status::Unknown,
            format!("{ev}; GPUs lower their link speed when idle"),
            "check again while the GPU is busy (`nvidia-smi -q -d PCIE` under load)",
        );
    }
    finding(
        id,
        A,
        subject,
        Status::Degraded,
        ev,
        "the link trained below its maximum: reseat the card, check the slot's wiring and BIOS \
         link settings (forced Gen, bifurcation), and the riser or cable",
    )
}

fn nic_far(input: &DoctorInput, g: &Device, nic: &Device, class: LinkClass) -> Finding {
    let id = ids::GDR_NIC_FAR;
    let s = format!("{}-{}", g.id, nic_name(nic));
    let (level, why) = nccl::gdr_level(input.env("NCCL_NET_GDR_LEVEL"));
    let Some(path) = NcclLevel::of_class(class) else {
        return finding(
            id,
            A,
            s,
            Status::Unknown,
            format!("GPU↔NIC class {class}: the source has no PCI tree"),
            crate::PAIR_CLASS_UNKNOWN,
        );
    };
    if path <= level {
        finding(
            id,
            A,
            s,
            Status::Ok,
            format!(
                "nearest RDMA NIC at {class} ≤ GDR level {level} ({why}): NCCL uses GPUDirect RDMA"
            ),
            "",
        )
    } else {
        finding(
            id,
            A,
            s,
            Status::Degraded,
            format!(
                "nearest RDMA NIC at {class} > GDR level {level} ({why}); NCCL turns \
                 GPUDirect RDMA off and stages through host memory"
            ),
            format!(
                "put an RDMA NIC under the same PCIe switch as the GPU (PIX/PXB); or, after \
                 measuring, NCCL_NET_GDR_LEVEL={path} to let NCCL use GDR at this distance"
            ),
        )
    }
}
