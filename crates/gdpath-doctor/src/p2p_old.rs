//! P2P checks, per GPU pair (and NVLink per GPU).

use super::nccl::{self, CpuKind, NcclLevel};
use super::{finding, DoctorInput, Gathered};
use gdpath::finding::{ids, Area, Finding, Status};
use gdpath_topo::facts::{DriverFacts, GpuFacts, GpuPairFacts, P2pCap};
use gdpath_topo::{AcsState, Device, LinkClass, Machine};

const A: Area = Area::P2p;

pub(super) fn check(input: &DoctorInput) -> Vec<Finding> {
    let m = input.machine;
    let gpus: Vec<&Device> = m.gpus().collect();
    let mut out = Vec::new();
    if gpus.len() < 2 {
        // GPUs the source cannot show (unclassified PCI entries) are unknown, not absent.
        let status = match super::gpu_absence(input) {
            Some((s @ Status::Unknown, _)) => s,
            _ => Status::Unavailable,
        };
        out.push(finding(
            ids::P2P_UNSUPPORTED,
            A,
            "system",
            status,
            format!(
                "{} GPU(s) in the PCI device list ({}): P2P needs two",
                gpus.len(),
                m.source
            ),
            "",
        ));
        return out;
    }
    let facts = input.driver.got();
    for g in &gpus {
        out.extend(nvlink_per_gpu(g, facts));
    }
    for (i, a) in gpus.iter().enumerate() {
        for b in &gpus[i + 1..] {
            out.extend(pair(input, a, b, facts));
        }
    }
    out
}

fn subject(a: &Device, b: &Device) -> String {
    format!("{}-{}", a.id, b.id)
}

/// The driver facts of a machine GPU, matched by PCI address.
fn gpu_facts<'f>(facts: Option<&'f DriverFacts>, d: &Device) -> Option<&'f GpuFacts> {
    facts?.gpu_by_pci(&d.pci.to_string())
}

/// Facts for the pair in either direction (a→b first).
fn pair_facts<'f>(facts: Option<&'f DriverFacts>, a: &Device, b: &Device) -> Vec<&'f GpuPairFacts> {
    let (Some(f), Some(fa), Some(fb)) = (facts, gpu_facts(facts, a), gpu_facts(facts, b)) else {
        return Vec::new();
    };
    [
        f.pair(fa.ordinal, fb.ordinal),
        f.pair(fb.ordinal, fa.ordinal),
    ]
    .into_iter()
    .flatten()
    .collect()
}

fn nvml_text(p: &GpuPairFacts, a: &Device, b: &Device, fa: u32) -> String {
    let (x, y) = if p.a == fa { (a, b) } else { (b, a) };
    let mut parts = Vec::new();
    if let Some(n) = &p.nvml {
        parts.push(format!(
            "NVML {}→{}: read {}, write {}, nvlink {}, atomics {}, pci {}",
            x.id,
            y.id,
            n.read.code(),
            n.write.code(),
            n.nvlink.code(),
            n.atomics.code(),
            n.pci.code()
        ));
    }
    if let Some(c) = &p.cuda {
        parts.push(format!(
            "CUDA cuDeviceCanAccessPeer({}→{}) {}, native atomics {}, performance rank {}",
            x.id,
            y.id,
            u8::from(c.access_supported),
            u8::from(c.native_atomics),
            c.performance_rank
        ));
    }
    parts.join("; ")
}

/// What the driver says about the pair: `Some(true)` P2P possible (NVML read and write OK, and
/// CUDA access where known, both directions), `Some(false)` not, `None` no facts.
fn driver_says(pairs: &[&GpuPairFacts]) -> Option<bool> {
    let mut known = false;
    for p in pairs {
        if let Some(n) = &p.nvml {
            known = true;
            if n.read != P2pCap::Ok || n.write != P2pCap::Ok {
                return Some(false);
            }
        }
        if let Some(c) = &p.cuda {
            known = true;
            if !c.access_supported {
                return Some(false);
            }
        }
    }
    known.then_some(true)
}

fn pair(input: &DoctorInput, a: &Device, b: &Device, facts: Option<&DriverFacts>) -> Vec<Finding> {
    let m = input.machine;
    let s = subject(a, b);
    let class = m.classify(a, b);
    let pcie = m.pcie_class(a, b);
    let nvlink = matches!(class, LinkClass::Nv(_));
    let pairs = pair_facts(facts, a, b);
    let fa = gpu_facts(facts, a).map(|g| g.ordinal).unwrap_or(u32::MAX);
    let evidence_driver = pairs
        .iter()
        .map(|p| nvml_text(p, a, b, fa))
        .collect::<Vec<_>>()
        .join("; ");
    let mut out = Vec::new();

    // p2p.unsupported: NVML read/write status and CUDA peer access.
    out.push(match driver_says(&pairs) {
        Some(true) => finding(
            ids::P2P_UNSUPPORTED,
            A,
            &s,
            Status::Ok,
            format!("{class}; {evidence_driver}"),
            "",
        ),
        Some(false) => finding(
            ids::P2P_UNSUPPORTED,
            A,
            &s,
            Status::Unavailable,
            format!("{class}; {evidence_driver}"),
            "copies between these GPUs are staged through pinned host memory; see the other \
             p2p findings for this pair for the cause (ACS, IOMMU, SYS, GPU SKU), or \
             `nvidia-smi topo -p2p rw`",
        ),
        None => no_driver(
            input,
            ids::P2P_UNSUPPORTED,
            &s,
            "NVML P2P status and CUDA peer access",
        ),
    });

    // p2p.gpu-not-supported: GNS in any capability.
    if !pairs.is_empty() {
        let gns = pairs.iter().any(|p| {
            p.nvml.is_some_and(|n| {
                [n.read, n.write, n.nvlink, n.atomics, n.pci].contains(&P2pCap::Gns)
            })
        });
        let has_nvml = pairs.iter().any(|p| p.nvml.is_some());
        if has_nvml {
            out.push(if gns {
                finding(
                    ids::P2P_GPU_NOT_SUPPORTED,
                    A,
                    &s,
                    Status::Unavailable,
                    format!("{evidence_driver} (GNS = GPU not supported)"),
                    "this GPU model does not support P2P (NVIDIA disables it on many GeForce \
                     SKUs); no setting enables it: use GPUs that support P2P, or rely on staged \
                     copies",
                )
            } else {
                finding(
                    ids::P2P_GPU_NOT_SUPPORTED,
                    A,
                    &s,
                    Status::Ok,
                    "NVML reports no GNS (GPU not supported) status for the pair",
                    "",
                )
            });
        }
    }

    // p2p.nvlink-no-p2p: NVLink present but P2P status not OK.
    if nvlink && !pairs.is_empty() {
        let nv_ok = pairs
            .iter()
            .all(|p| p.nvml.is_none_or(|n| n.nvlink == P2pCap::Ok));
        let ok = driver_says(&pairs) != Some(false) && nv_ok;
        out.push(if ok {
            finding(
                ids::P2P_NVLINK_NO_P2P,
                A,
                &s,
                Status::Ok,
                format!("{class}; {evidence_driver}"),
                "",
            )
        } else {
            finding(
                ids::P2P_NVLINK_NO_P2P,
                A,
                &s,
                Status::Unavailable,
                format!("{class} but {evidence_driver}"),
                "NVLink is there but the driver does not allow P2P over it (NCCL stops with \
                 \"P2P is disabled between NVLINK connected GPUs\"): check `nvidia-smi nvlink \
                 -s`, start nvidia-fabricmanager on NVSwitch systems, and reset the GPUs",
            )
        });
    }

    // The PCIe-path verdicts below do not apply where NVLink carries P2P; see
    // `nvlink_unlisted`.
    let unlisted = nvlink_unlisted(m, facts, a, b);
    let pcie_verdict = |f: Finding| match &unlisted {
        Some(why) => pcie_only(f, why),
        None => f,
    };
    // p2p.acs-enabled: ACS redirect on bridges between the pair.
    out.push(pcie_verdict(acs(m, a, b, &s, nvlink, A)));
    // p2p.iommu-translated.
    out.push(pcie_verdict(iommu(m, a, b, &s, nvlink)));
    // p2p.cross-socket.
    out.push(pcie_verdict(cross_socket(&s, class, pcie, nvlink)));
    // p2p.disabled: environment.
    out.push(disabled(input, a, b, &s));
    // p2p.nccl-level.
    out.push(pcie_verdict(nccl_level(input, &s, class, &pairs)));
    out
}

/// Why the pair's PCIe path may not be its P2P path, when the source cannot tell: both GPUs are
/// SXM parts (which sit on a baseboard that joins them with NVLink, directly or through
/// NVSwitch: [`nvlink_norm`]), and the source lists no NVLink at all and no driver facts are at
/// hand (neither attached to the machine nor gathered for this run)
/// (a provider's NCCL topology file such as AWS p4d's, an hwloc export without the NVML plugin,
/// a sysfs copy). `None` when NVLink between them is known to be absent or present.
fn nvlink_unlisted(
    m: &Machine,
    facts: Option<&DriverFacts>,
    a: &Device,
    b: &Device,
) -> Option<String> {
    if facts.is_some() || m.driver.is_some() || !m.nvlinks.is_empty() {
        return None;
    }
    let model = |d: &Device| d.name.clone().filter(|n| nvlink_norm(n).is_some());
    let (ma, mb) = (model(a)?, model(b)?);
    let models = if ma == mb {
        ma
    } else {
        format!("{ma} and {mb}")
    };
    Some(format!(
        "but both GPUs are SXM parts ({models}), which their baseboard joins with NVLink, and \
         the source ({}) lists no NVLink: P2P most likely does not take this PCIe path",
        m.source
    ))
}

/// A PCIe-path verdict for a pair whose NVLink is unlisted: a problem found on the PCIe path
/// becomes `unknown`, the evidence saying why; a clean PCIe path stays `ok`.
fn pcie_only(mut f: Finding, why: &str) -> Finding {
    if matches!(f.status, Status::Degraded | Status::Unavailable) {
        f.status = Status::Unknown;
        f.evidence = format!("{} — {why}", f.evidence);
        f.remedy = "run `gdpath doctor` on the machine itself, where the driver reports NVLink \
                    (`nvidia-smi topo -m` shows NV# between NVLink-joined GPUs)"
            .into();
    }
    f
}

fn no_driver(input: &DoctorInput, id: &str, subject: &str, what: &str) -> Finding {
    let (status, evidence) = match &input.driver {
        Gathered::Failed(e) => (Status::Unknown, format!("{what}: driver facts failed: {e}")),
        _ => (input.missing_status(), input.missing_evidence(what)),
    };
    finding(id, A, subject, status, evidence, "")
}

/// p2p.acs-enabled for two devices (a GPU pair, or a GPU and its NIC under `area` GDR): ACS
/// P2P redirect on any bridge between them.
pub(super) fn acs(
    m: &Machine,
    a: &Device,
    b: &Device,
    s: &str,
    nvlink: bool,
    area: Area,
) -> Finding {
    let id = ids::P2P_ACS_ENABLED;
    let fin = |st: Status, ev: &str, rem: &str| finding(id, area, s, st, ev, rem);
    if nvlink {
        return fin(
            Status::Ok,
            "joined by NVLink: P2P does not cross PCIe bridges, so ACS does not apply",
            "",
        );
    }
    if !m.tree_known {
        return fin(
            Status::Unknown,
            "the source has no PCI tree: the bridges between the pair are unknown",
            "",
        );
    }
    let bridges = m.bridges_between(a, b);
    if bridges.is_empty() {
        return fin(
            Status::Ok,
            &format!(
                "no PCIe bridge between them (both on the root bus {})",
                a.host_bridge.as_deref().unwrap_or("?")
            ),
            "",
        );
    }
    let mut redirect = Vec::new();
    let mut unknown = Vec::new();
    let mut clean = Vec::new();
    for br in &bridges {
        let cfg = format!("/sys/bus/pci/devices/{}/config", br.pci);
        match br.acs {
            Some(st @ AcsState::Present { control, .. }) if st.redirects_p2p() => {
                redirect.push(format!(
                    "{} ACS control {} ({cfg})",
                    br.pci,
                    control.names().join(" ")
                ))
            }
            Some(_) => clean.push(br.pci.to_string()),
            None => unknown.push(br.pci.to_string()),
        }
    }
    if !redirect.is_empty() {
        fin(
            Status::Degraded,
            &format!("P2P request/completion redirect on {}", redirect.join("; ")),
            "P2P traffic is sent up to the root complex (slower, and on many platforms refused): \
             disable ACS on these bridges (`setpci -s BDF ECAP_ACS+6.w=0` at boot, or the \
             BIOS's ACS/IOMMU settings) on bare metal; keep it only where the IOMMU must \
             isolate devices (VM passthrough)",
        )
    } else if !unknown.is_empty() && matches!(m.source.as_str(), "nccl-xml" | "hwloc-xml") {
        // A topology file carries no PCI config space (and NCCL's bridges are often
        // synthetic): running as root cannot help; only the machine itself can tell.
        fin(
            Status::Unknown,
            &format!(
                "ACS of {} is not in the source ({}): it carries no PCI config space",
                unknown.join(", "),
                m.source
            ),
            "run `gdpath doctor` on the machine itself (as root) to read the ACS capability",
        )
    } else if !unknown.is_empty() {
        fin(
            Status::Unknown,
            &format!(
                "ACS unknown on {}: their config space is readable past 64 bytes only as root{}",
                unknown.join(", "),
                if clean.is_empty() {
                    String::new()
                } else {
                    format!("; no redirect on {}", clean.join(", "))
                }
            ),
            "run as root (or `sudo lspci -vvv`) to read the ACS capability",
        )
    } else {
        fin(
            Status::Ok,
            &format!("no ACS redirect on {} (sysfs config)", clean.join(", ")),
            "",
        )
    }
}

fn iommu(m: &Machine, a: &Device, b: &Device, s: &str, nvlink: bool) -> Finding {
    let id = ids::P2P_IOMMU_TRANSLATED;
    if nvlink {
        return finding(
            id,
            A,
            s,
            Status::Ok,
            "joined by NVLink: the IOMMU is not on the P2P path",
            "",
        );
    }
    match m.iommu.enabled() {
        None => {
            return finding(
                id,
                A,
                s,
                Status::Unknown,
                "/sys/class/iommu not in the source: IOMMU state unknown",
                "",
            )
        }
        Some(false) => {
            return finding(
                id,
                A,
                s,
                Status::Ok,
                "IOMMU off (/sys/class/iommu and /sys/kernel/iommu_groups empty)",
                "",
            )
        }
        Some(true) => {}
    }
    let ty = |d: &Device| -> (String, Option<String>) {
        match d.iommu_group {
            Some(g) => {
                let t = m.iommu.group_type(g).map(str::to_owned);
                (
                    format!(
                        "{} group {g} type {}",
                        d.id,
                        t.as_deref().unwrap_or("unknown")
                    ),
                    t,
                )
            }
            None => (format!("{} in no IOMMU group", d.id), None),
        }
    };
    let (ea, ta) = ty(a);
    let (eb, tb) = ty(b);
    let evidence = format!("{ea}, {eb} (/sys/kernel/iommu_groups/N/type)");
    let translated = |t: &Option<String>| t.as_deref().is_some_and(|t| t.starts_with("DMA"));
    if translated(&ta) || translated(&tb) {
        finding(
            id,
            A,
            s,
            Status::Degraded,
            evidence,
            "P2P over PCIe with the IOMMU translating DMA goes through the root complex or \
             fails: boot with `iommu=pt` (Intel: `intel_iommu=on iommu=pt`), or set the GPUs' \
             groups to identity (`echo identity > /sys/kernel/iommu_groups/N/type` with the \
             group's drivers unbound)",
        )
    } else if ta.is_none() || tb.is_none() {
        finding(id, A, s, Status::Unknown, evidence, "")
    } else {
        finding(id, A, s, Status::Ok, evidence, "")
    }
}

fn cross_socket(s: &str, class: LinkClass, pcie: LinkClass, nvlink: bool) -> Finding {
    let id = ids::P2P_CROSS_SOCKET;
    if nvlink {
        return finding(
            id,
            A,
            s,
            Status::Ok,
            format!("{class} (PCIe path {pcie}): P2P goes over NVLink"),
            "",
        );
    }
    match class {
        LinkClass::Sys => finding(
            id,
            A,
            s,
            Status::Degraded,
            format!("{class}: the pair crosses the SMP interconnect between NUMA nodes (QPI/UPI/Infinity Fabric)"),
            "P2P across sockets is slow or refused on most platforms (NVML then reports CNS or \
             TNS): place GPUs that exchange data under the same socket, or join them with NVLink",
        ),
        LinkClass::Unknown => finding(
            id,
            A,
            s,
            Status::Unknown,
            "N/A: the source has no PCI tree and the NUMA nodes do not differ",
            "",
        ),
        c => finding(id, A, s, Status::Ok, format!("{c}: same socket"), ""),
    }
}

/// The GPU indices that `CUDA_VISIBLE_DEVICES` leaves visible, as ordinals; `None` when it does
/// not name plain ordinals (UUIDs, MIG devices) or is unset.
fn visible_ordinals(v: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for part in v.split(',') {
        let p = part.trim();
        if p.is_empty() {
            break;
        }
        match p.parse::<i64>() {
            // CUDA stops at the first invalid ordinal.
            Ok(n) if n < 0 => break,
            Ok(n) => out.push(u32::try_from(n).ok()?),
            Err(_) => return None,
        }
    }
    Some(out)
}

fn disabled(input: &DoctorInput, a: &Device, b: &Device, s: &str) -> Finding {
    let id = ids::P2P_DISABLED;
    let mut why = Vec::new();
    let mut notes = Vec::new();
    if let Some(d) = input.env("NCCL_P2P_DISABLE") {
        if d == "1" {
            why.push("NCCL_P2P_DISABLE=1: NCCL will not use P2P for any pair".to_owned());
        } else {
            notes.push(format!("NCCL_P2P_DISABLE={d} (not 1: no effect)"));
        }
    }
    if let Some(v) = input.env("CUDA_VISIBLE_DEVICES") {
        // Ordinals follow CUDA's order; with the driver's facts we know each GPU's ordinal,
        // otherwise PCI order (CUDA_DEVICE_ORDER=PCI_BUS_ID) is the best guess.
        let ord = |d: &Device| -> u32 {
            gpu_facts(input.driver.got(), d)
                .map(|g| g.ordinal)
                .unwrap_or_else(|| {
                    input
                        .machine
                        .gpus()
                        .position(|g| g.pci == d.pci)
                        .unwrap_or(0) as u32
                })
        };
        match visible_ordinals(v) {
            Some(vis) => {
                let hidden: Vec<&str> = [a, b]
                    .into_iter()
                    .filter(|d| !vis.contains(&ord(d)))
                    .map(|d| d.id.as_str())
                    .collect();
                if hidden.is_empty() {
                    notes.push(format!("CUDA_VISIBLE_DEVICES={v} shows both"));
                } else {
                    why.push(format!(
                        "CUDA_VISIBLE_DEVICES={v} hides {}: processes started with it cannot \
                         use this pair",
                        hidden.join(" and ")
                    ));
                }
            }
            None => notes.push(format!(
                "CUDA_VISIBLE_DEVICES={v} names UUIDs or MIG devices: which GPUs it shows is \
                 not checked"
            )),
        }
    }
    if why.is_empty() {
        let ev = if notes.is_empty() {
            "NCCL_P2P_DISABLE and CUDA_VISIBLE_DEVICES unset".to_owned()
        } else {
            notes.join("; ")
        };
        finding(id, A, s, Status::Ok, format!("environment: {ev}"), "")
    } else {
        why.extend(notes);
        finding(
            id,
            A,
            s,
            Status::Degraded,
            format!("environment: {}", why.join("; ")),
            "unset the variable (or list both GPUs in CUDA_VISIBLE_DEVICES) if P2P is wanted",
        )
    }
}

fn nccl_level(input: &DoctorInput, s: &str, class: LinkClass, pairs: &[&GpuPairFacts]) -> Finding {
    let id = ids::P2P_NCCL_LEVEL;
    let cpu = input
        .text("/proc/cpuinfo")
        .map_or(CpuKind::Other, |c| CpuKind::from_cpuinfo(&c));
    let (level, why) = nccl::p2p_level(
        input.env("NCCL_P2P_DISABLE"),
        input.env("NCCL_P2P_LEVEL"),
        cpu,
        input.machine.gpus().count(),
    );
    let Some(path) = NcclLevel::of_class(class) else {
        return finding(
            id,
            A,
            s,
            Status::Unknown,
            format!("pair class {class}: NCCL's path type unknown; P2P level {level} ({why})"),
            "",
        );
    };
    let nvml_refuses = driver_says(pairs) == Some(false);
    if path <= level && !nvml_refuses {
        finding(
            id,
            A,
            s,
            Status::Ok,
            format!("NCCL path {path} ({class}) ≤ P2P level {level} ({why}): NCCL uses its P2P transport"),
            "",
        )
    } else {
        let cause = if nvml_refuses {
            "NVML's P2P read/write status is not OK, so NCCL refuses P2P".to_owned()
        } else {
            format!("NCCL path {path} ({class}) > P2P level {level} ({why})")
        };
        finding(
            id,
            A,
            s,
            Status::Degraded,
            format!("{cause}: NCCL moves this pair's data through host shared memory"),
            if level == NcclLevel::Loc {
                "unset NCCL_P2P_DISABLE / NCCL_P2P_LEVEL=LOC if P2P is wanted".to_owned()
            } else if nvml_refuses {
                "fix P2P itself first (see p2p.unsupported for this pair)".to_owned()
            } else {
                format!(
                    "NCCL_P2P_LEVEL={path} makes NCCL try P2P here; measure first (`gdpath \
                     bench p2p`): beyond PXB P2P often runs slower than through host memory"
                )
            },
        )
    }
}

/// NVLink links a GPU model has, from NVIDIA's data sheets: H100/H200 SXM and B200 18 (NVLink
/// 4/5), A100 SXM4 12 (NVLink 3), V100 SXM2 6 (NVLink 2), P100 SXM2 4 (NVLink 1). PCIe and NVL
/// cards (bridged) are not listed: their count depends on the bridges fitted.
pub fn nvlink_norm(name: &str) -> Option<u32> {
    // NVML names (`NVIDIA A100-SXM4-40GB`) and PCI ID names (`A100 SXM4 40GB`) alike.
    let n = name.to_ascii_uppercase().replace(' ', "-");
    if n.contains("PCIE") || n.contains("-NVL") {
        return None;
    }
    let table: [(&str, u32); 7] = [
        ("GH200", 18),
        ("H200", 18),
        ("H100", 18),
        ("B200", 18),
        ("A100-SXM", 12),
        ("V100-SXM2", 6),
        ("P100-SXM2", 4),
    ];
    table.iter().find(|(k, _)| n.contains(k)).map(|&(_, v)| v)
}

fn nvlink_per_gpu(g: &Device, facts: Option<&DriverFacts>) -> Option<Finding> {
    let gf = gpu_facts(facts, g)?;
    let up = gf.nvlinks.len() as u32;
    let norm = nvlink_norm(&gf.name);
    let id = ids::P2P_NVLINK_DEGRADED;
    let s = g.id.clone();
    match norm {
        Some(n) if up < n => Some(finding(
            id,
            A,
            s,
            Status::Degraded,
            format!(
                "{}: {up} of {n} NVLinks up (NVML nvmlDeviceGetNvLinkState){}",
                gf.name,
                if up == 0 {
                    ""
                } else {
                    "; links down lower NV# and P2P bandwidth"
                }
            ),
            format!(
                "check `nvidia-smi nvlink -s` and `nvidia-smi -q -d NVLINK` for links down or \
                 with errors; reseat or service the baseboard; on NVSwitch systems check \
                 nvidia-fabricmanager{}",
                if up == 0 {
                    ". Until a link is up, UCX's default also turns cuda_ipc's GPU → GPU reads \
                     (gets) between processes off on this GPU and emulates them in software \
                     (openucx/ucx PR #7566; seen with UCX 1.22 on a one-GPU H200 VM): gdpath \
                     sets UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y unless the environment sets it; \
                     other UCX applications need that setting, or post writes"
                } else {
                    ""
                }
            ),
        )),
        Some(n) => Some(finding(
            id,
            A,
            s,
            Status::Ok,
            format!("{}: {up} of {n} NVLinks up (NVML)", gf.name),
            "",
        )),
        None if up > 0 => Some(finding(
            id,
            A,
            s,
            Status::Ok,
            format!(
                "{}: {up} NVLinks up (NVML); no reference count for this model",
                gf.name
            ),
            "",
        )),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn norms_and_visible() {
        assert_eq!(nvlink_norm("NVIDIA H200"), Some(18));
        assert_eq!(nvlink_norm("NVIDIA H200 NVL"), None);
        assert_eq!(nvlink_norm("NVIDIA H100 PCIe"), None);
        assert_eq!(nvlink_norm("NVIDIA A100-SXM4-80GB"), Some(12));
        // PCI ID names (gdpath-topo's table) as well as NVML's.
        assert_eq!(nvlink_norm("A100 SXM4 40GB"), Some(12));
        assert_eq!(nvlink_norm("A100 PCIe 80GB"), None);
        assert_eq!(nvlink_norm("Tesla V100-SXM2-32GB"), Some(6));
        assert_eq!(nvlink_norm("NVIDIA L4"), None);
        assert_eq!(visible_ordinals("0,1"), Some(vec![0, 1]));
        assert_eq!(visible_ordinals("1,-1,0"), Some(vec![1]));
        assert_eq!(visible_ordinals(""), Some(vec![]));
        assert_eq!(visible_ordinals("GPU-972c1a7c"), None);
    }
}
