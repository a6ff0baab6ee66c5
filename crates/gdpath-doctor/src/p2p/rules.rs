//! The P2P rules: the findings of one [`PairKey`] (their subject left empty for the caller).
//!
//! What a source cannot describe is unknown, never a verdict. A pair whose NVLink the source
//! does not describe ([`gdpath_topo::PairClass::nvlink_unknown`]: NCCL files without `<nvlink>`,
//! hwloc exports without an `NVLinkBandwidth` matrix, sysfs without driver facts) may move its
//! P2P data over NVLink or over its PCIe path, so a PCIe-path verdict holds only where NVLink
//! could not change it:
//!
//! - a PCIe path that works (no ACS redirect, no translating IOMMU, not SYS, within NCCL's P2P
//!   level) is `ok` either way: over NVLink the pair does at least as well;
//! - a PCIe path that fails (ACS redirect, IOMMU translation, SYS, beyond NCCL's P2P level) is
//!   `unknown`: NVLink would carry P2P past all of these;
//! - what NVLink cannot undo stays a verdict: the driver refusing P2P (NVML, CUDA), a GPU
//!   without P2P (GNS), `NCCL_P2P_DISABLE=1` (NCCL level `LOC`), `CUDA_VISIBLE_DEVICES` hiding a
//!   GPU of the pair.

use super::key::{acs_control, Acs, Direction, PairKey};
use crate::nccl::{self, CpuKind, NcclLevel};
use crate::{finding, DoctorInput, Gathered};
use gdpath::finding::{ids, Area, Finding, Status};
use gdpath_topo::facts::P2pCap;
use gdpath_topo::{LinkClass, Machine, NvLinkState};

const A: Area = Area::P2p;

/// What the rules need beyond the key, worked out once per machine.
pub(crate) struct Rules<'a, 'i> {
    input: &'a DoctorInput<'i>,
    /// NCCL's P2P level and why.
    level: (NcclLevel, String),
    /// `NCCL_P2P_DISABLE=1`, said for every pair.
    disable: Option<String>,
    /// `CUDA_VISIBLE_DEVICES` when it names ordinals, and the GPUs it hides (`GPU2–GPU7`,
    /// empty when none).
    visible: Option<(String, String)>,
    /// What the environment says for every pair without deciding anything
    /// (`NCCL_P2P_DISABLE=0 (not 1: no effect)`).
    notes: Vec<String>,
}

impl<'a, 'i> Rules<'a, 'i> {
    /// `hidden` lists the GPUs `CUDA_VISIBLE_DEVICES` hides (ids); `ordinals` says whether it
    /// names plain ordinals (UUIDs and MIG devices are noted, not judged).
    pub(crate) fn new(input: &'a DoctorInput<'i>, hidden: &[&str], ordinals: bool) -> Self {
        let cpu = input
            .text("/proc/cpuinfo")
            .map_or(CpuKind::Other, |c| CpuKind::from_cpuinfo(&c));
        let level = nccl::p2p_level(
            input.env("NCCL_P2P_DISABLE"),
            input.env("NCCL_P2P_LEVEL"),
            cpu,
            input.machine.gpus().count(),
        );
        let mut notes = Vec::new();
        let disable = match input.env("NCCL_P2P_DISABLE") {
            Some("1") => Some("NCCL_P2P_DISABLE=1: NCCL will not use P2P for any pair".to_owned()),
            Some(d) => {
                notes.push(format!("NCCL_P2P_DISABLE={d} (not 1: no effect)"));
                None
            }
            None => None,
        };
        let visible = match input.env("CUDA_VISIBLE_DEVICES") {
            Some(v) if ordinals => Some((v.to_owned(), crate::subjects::compress(hidden))),
            Some(v) => {
                notes.push(format!(
                    "CUDA_VISIBLE_DEVICES={v} names UUIDs or MIG devices: which GPUs it shows \
                     is not checked"
                ));
                None
            }
            None => None,
        };
        Rules {
            input,
            level,
            disable,
            visible,
            notes,
        }
    }

    fn m(&self) -> &Machine {
        self.input.machine
    }

    /// Why NVLink is unknown, for the evidence.
    fn nvlink_gap(&self) -> &str {
        self.m()
            .coverage
            .nvlink
            .gap()
            .unwrap_or("the source does not describe NVLink")
    }

    /// The findings of a key, in report order; subjects empty.
    pub(crate) fn findings(&self, k: &PairKey) -> Vec<Finding> {
        let mut out = vec![self.unsupported(k)];
        out.extend(self.gpu_not_supported(k));
        out.extend(self.nvlink_no_p2p(k));
        let unknown = k.class.nvlink_unknown().then(|| self.nvlink_gap());
        out.push(acs_finding(self.m(), &k.acs, A, "", unknown));
        out.push(self.iommu(k));
        out.push(self.cross_socket(k));
        out.push(self.disabled(k));
        out.push(self.nccl_level(k));
        out
    }

    fn unsupported(&self, k: &PairKey) -> Finding {
        let class = k.class.class();
        match driver_says(&k.driver) {
            Some(true) => finding(
                ids::P2P_UNSUPPORTED,
                A,
                "",
                Status::Ok,
                format!(
                    "{class}: the driver allows P2P both ways; {}",
                    driver_text(&k.driver)
                ),
                "",
            ),
            Some(false) => finding(
                ids::P2P_UNSUPPORTED,
                A,
                "",
                Status::Unavailable,
                format!(
                    "{class}: the driver refuses P2P; {}",
                    driver_text(&k.driver)
                ),
                "copies between these GPUs are staged through pinned host memory; see the other \
                 p2p findings for this pair for the cause (ACS, IOMMU, SYS, GPU SKU), or \
                 `nvidia-smi topo -p2p rw`",
            ),
            None => self.no_driver(ids::P2P_UNSUPPORTED, "NVML P2P status and CUDA peer access"),
        }
    }

    fn gpu_not_supported(&self, k: &PairKey) -> Option<Finding> {
        let nvml: Vec<[P2pCap; 5]> = k.driver.iter().filter_map(|d| d.nvml).collect();
        if nvml.is_empty() {
            return None;
        }
        let gns = nvml.iter().any(|caps| caps.contains(&P2pCap::Gns));
        Some(if gns {
            finding(
                ids::P2P_GPU_NOT_SUPPORTED,
                A,
                "",
                Status::Unavailable,
                format!(
                    "GNS (GPU not supported) in NVML's P2P status; {}",
                    driver_text(&k.driver)
                ),
                "this GPU model does not support P2P (NVIDIA disables it on many GeForce \
                 SKUs); no setting enables it: use GPUs that support P2P, or rely on staged \
                 copies",
            )
        } else {
            finding(
                ids::P2P_GPU_NOT_SUPPORTED,
                A,
                "",
                Status::Ok,
                "NVML reports no GNS (GPU not supported) status for the pair",
                "",
            )
        })
    }

    fn nvlink_no_p2p(&self, k: &PairKey) -> Option<Finding> {
        if !matches!(k.class.nvlink, NvLinkState::Links(_)) || k.driver.is_empty() {
            return None;
        }
        let class = k.class.class();
        let nv_ok = k
            .driver
            .iter()
            .all(|d| d.nvml.is_none_or(|c| c[2] == P2pCap::Ok));
        Some(if driver_says(&k.driver) != Some(false) && nv_ok {
            finding(
                ids::P2P_NVLINK_NO_P2P,
                A,
                "",
                Status::Ok,
                format!(
                    "{class}: the driver allows P2P over NVLink; {}",
                    driver_text(&k.driver)
                ),
                "",
            )
        } else {
            finding(
                ids::P2P_NVLINK_NO_P2P,
                A,
                "",
                Status::Unavailable,
                format!(
                    "{class} but the driver does not allow P2P over it; {}",
                    driver_text(&k.driver)
                ),
                "NVLink is there but the driver does not allow P2P over it (NCCL stops with \
                 \"P2P is disabled between NVLINK connected GPUs\"): check `nvidia-smi nvlink \
                 -s`, start nvidia-fabricmanager on NVSwitch systems, and reset the GPUs",
            )
        })
    }

    fn no_driver(&self, id: &str, what: &str) -> Finding {
        let input = self.input;
        let (status, evidence, remedy) = match &input.driver {
            Gathered::Failed(e) => (
                Status::Unknown,
                format!("{what}: driver facts failed: {e}"),
                "check that the NVIDIA driver's libraries load (`nvidia-smi` works)",
            ),
            _ => (
                input.missing_status(),
                input.missing_evidence(what),
                input.missing_remedy(),
            ),
        };
        finding(id, A, "", status, evidence, remedy)
    }

    fn iommu(&self, k: &PairKey) -> Finding {
        let id = ids::P2P_IOMMU_TRANSLATED;
        let fin = |st: Status, ev: String, rem: &str| finding(id, A, "", st, ev, rem);
        if matches!(k.class.nvlink, NvLinkState::Links(_)) {
            return fin(
                Status::Ok,
                "joined by NVLink: the IOMMU is not on the P2P path".into(),
                "",
            );
        }
        let m = self.m();
        match m.iommu.enabled() {
            None => {
                return fin(
                    Status::Unknown,
                    format!(
                        "IOMMU state not in the source; {}",
                        m.coverage.iommu.gap().unwrap_or("no /sys/class/iommu")
                    ),
                    &crate::read_the_machine(
                        "/sys/kernel/iommu_groups shows whether the IOMMU translates",
                    ),
                )
            }
            Some(false) => {
                return fin(
                    Status::Ok,
                    "IOMMU off (/sys/class/iommu and /sys/kernel/iommu_groups empty)".into(),
                    "",
                )
            }
            Some(true) => {}
        }
        let [a, b] = &k.iommu;
        let types = format!(
            "the GPUs' IOMMU groups: {} and {} (/sys/kernel/iommu_groups/N/type)",
            a.text(),
            b.text()
        );
        if a.translated() || b.translated() {
            let remedy = "P2P over PCIe with the IOMMU translating DMA goes through the root \
                          complex or fails: boot with `iommu=pt` (Intel: `intel_iommu=on \
                          iommu=pt`), or set the GPUs' groups to identity (`echo identity > \
                          /sys/kernel/iommu_groups/N/type` with the group's drivers unbound)";
            match k.class.nvlink_unknown() {
                true => fin(
                    Status::Unknown,
                    format!(
                        "the IOMMU translates DMA over PCIe, but NVLink is not in the source; \
                         {types}; over NVLink the IOMMU is not on the P2P path; NVLink unknown: \
                         {}",
                        self.nvlink_gap()
                    ),
                    remedy,
                ),
                false => fin(
                    Status::Degraded,
                    format!("the IOMMU translates the pair's DMA; {types}"),
                    remedy,
                ),
            }
        } else if a.text() == "identity" && b.text() == "identity" {
            fin(
                Status::Ok,
                format!("the IOMMU passes the pair's DMA through; {types}"),
                "",
            )
        } else {
            fin(
                Status::Unknown,
                format!("IOMMU mode of the pair unknown; {types}"),
                "",
            )
        }
    }

    fn cross_socket(&self, k: &PairKey) -> Finding {
        let id = ids::P2P_CROSS_SOCKET;
        let class = k.class.class();
        let pcie = k.class.pcie;
        if matches!(k.class.nvlink, NvLinkState::Links(_)) {
            return finding(
                id,
                A,
                "",
                Status::Ok,
                format!("{class} (PCIe path {pcie}): P2P goes over NVLink"),
                "",
            );
        }
        match pcie {
            LinkClass::Sys if k.class.nvlink_unknown() => finding(
                id,
                A,
                "",
                Status::Unknown,
                format!(
                    "PCIe path SYS crosses the SMP interconnect, but NVLink is not in the \
                     source; without NVLink between the pair P2P takes that path, slow or \
                     refused; NVLink unknown: {}",
                    self.nvlink_gap()
                ),
                REPLAY_NVLINK_REMEDY,
            ),
            LinkClass::Sys => finding(
                id,
                A,
                "",
                Status::Degraded,
                "SYS: the pair crosses the SMP interconnect between NUMA nodes \
                 (QPI/UPI/Infinity Fabric)",
                "P2P across sockets is slow or refused on most platforms (NVML then reports CNS \
                 or TNS): place GPUs that exchange data under the same socket, or join them with \
                 NVLink",
            ),
            LinkClass::Unknown => finding(
                id,
                A,
                "",
                Status::Unknown,
                if self.m().stated_pcie.is_some() {
                    "N/A: the source does not state the pair's PCIe class"
                } else {
                    "N/A: the source has no PCI tree and the NUMA nodes do not differ"
                },
                crate::PAIR_CLASS_UNKNOWN,
            ),
            c => finding(id, A, "", Status::Ok, format!("{c}: same socket"), ""),
        }
    }

    fn disabled(&self, k: &PairKey) -> Finding {
        let id = ids::P2P_DISABLED;
        let mut why: Vec<String> = self.disable.iter().cloned().collect();
        let mut notes = Vec::new();
        if let Some((v, hidden)) = &self.visible {
            if k.hidden > 0 {
                why.push(format!(
                    "CUDA_VISIBLE_DEVICES={v} hides {hidden}, {} of this pair: processes \
                     started with it cannot use the pair",
                    if k.hidden == 2 {
                        "both GPUs"
                    } else {
                        "one GPU"
                    }
                ));
            } else {
                notes.push(format!("CUDA_VISIBLE_DEVICES={v} shows both"));
            }
        }
        notes.extend(self.notes.iter().cloned());
        if why.is_empty() {
            let ev = if notes.is_empty() {
                "NCCL_P2P_DISABLE and CUDA_VISIBLE_DEVICES unset".to_owned()
            } else {
                notes.join("; ")
            };
            finding(id, A, "", Status::Ok, format!("environment: {ev}"), "")
        } else {
            why.extend(notes);
            finding(
                id,
                A,
                "",
                Status::Degraded,
                format!("environment: {}", why.join("; ")),
                "unset the variable (or list both GPUs in CUDA_VISIBLE_DEVICES) if P2P is wanted",
            )
        }
    }

    fn nccl_level(&self, k: &PairKey) -> Finding {
        let id = ids::P2P_NCCL_LEVEL;
        let class = k.class.class();
        let (level, why) = (self.level.0, self.level.1.as_str());
        // `NCCL path PHB`, or `NCCL path PHB (NODE)` where gdpath's class says more.
        let named = |path: NcclLevel| {
            if path.to_string() == class.to_string() {
                format!("NCCL path {path}")
            } else {
                format!("NCCL path {path} ({class})")
            }
        };
        let Some(path) = NcclLevel::of_class(class) else {
            return finding(
                id,
                A,
                "",
                Status::Unknown,
                format!("pair class {class}: NCCL's path type unknown; P2P level {level} ({why})"),
                crate::PAIR_CLASS_UNKNOWN,
            );
        };
        let refuses = driver_says(&k.driver) == Some(false);
        if path <= level && !refuses {
            return finding(
                id,
                A,
                "",
                Status::Ok,
                format!(
                    "{} ≤ P2P level {level} ({why}): NCCL uses its P2P transport",
                    named(path)
                ),
                "",
            );
        }
        // NVLink (NCCL path NVL) would be within any level but LOC; a refusing driver stays.
        if k.class.nvlink_unknown() && !refuses && level != NcclLevel::Loc {
            return finding(
                id,
                A,
                "",
                Status::Unknown,
                format!(
                    "{} > P2P level {level} ({why}), but NVLink is not in the source; over \
                     NVLink (path NVL) NCCL uses P2P, without it NCCL moves this pair's data \
                     through host shared memory; NVLink unknown: {}",
                    named(path),
                    self.nvlink_gap()
                ),
                REPLAY_NVLINK_REMEDY,
            );
        }
        let cause = if refuses {
            "NVML's P2P read/write status is not OK, so NCCL refuses P2P".to_owned()
        } else {
            format!("{} > P2P level {level} ({why})", named(path))
        };
        finding(
            id,
            A,
            "",
            Status::Degraded,
            format!("{cause}: NCCL moves this pair's data through host shared memory"),
            if level == NcclLevel::Loc {
                "unset NCCL_P2P_DISABLE / NCCL_P2P_LEVEL=LOC if P2P is wanted".to_owned()
            } else if refuses {
                "fix P2P itself first (see p2p.unsupported for this pair)".to_owned()
            } else {
                format!(
                    "NCCL_P2P_LEVEL={path} makes NCCL try P2P on this pair; measure first (`gdpath \
                     bench p2p`): beyond PXB P2P often runs slower than through host memory"
                )
            },
        )
    }
}

/// The remedy of a PCIe-path verdict left unknown because the source does not describe NVLink.
const REPLAY_NVLINK_REMEDY: &str = "read the machine where NVLink is known: `gdpath doctor` on \
     the machine itself (the driver reports NVLink), a snapshot of it (`gdpath topo capture`), \
     or its `nvidia-smi topo -m` text (`--smi-topo FILE`)";

/// What the driver says about the pair: `Some(true)` P2P possible (NVML read and write OK, and
/// CUDA access where known, both directions), `Some(false)` not, `None` no facts.
fn driver_says(dirs: &[Direction]) -> Option<bool> {
    let mut known = false;
    for d in dirs {
        if let Some(c) = d.nvml {
            known = true;
            if c[0] != P2pCap::Ok || c[1] != P2pCap::Ok {
                return Some(false);
            }
        }
        if let Some((access, _, _)) = d.cuda {
            known = true;
            if !access {
                return Some(false);
            }
        }
    }
    known.then_some(true)
}

/// The driver's facts for a pair in words, both directions at once where they agree.
fn driver_text(dirs: &[Direction]) -> String {
    let nvml = |c: [P2pCap; 5]| {
        format!(
            "read {}, write {}, nvlink {}, atomics {}, pci {}",
            c[0].code(),
            c[1].code(),
            c[2].code(),
            c[3].code(),
            c[4].code()
        )
    };
    let cuda = |(access, atomics, rank): (bool, bool, i32)| {
        format!(
            "cuDeviceCanAccessPeer {}, native atomics {}, performance rank {rank}",
            u8::from(access),
            u8::from(atomics)
        )
    };
    let both = |what: &str, texts: Vec<String>| -> Option<String> {
        match texts.as_slice() {
            [] => None,
            [one] => Some(format!("{what} (one direction): {one}")),
            [a, b] if a == b => Some(format!("{what} (both directions): {a}")),
            [a, b] => Some(format!(
                "{what}: {a} (first GPU → second), {b} (second → first)"
            )),
            many => Some(format!("{what}: {}", many.join(" / "))),
        }
    };
    [
        both(
            "NVML P2P status",
            dirs.iter().filter_map(|d| d.nvml.map(nvml)).collect(),
        ),
        both(
            "CUDA",
            dirs.iter().filter_map(|d| d.cuda.map(cuda)).collect(),
        ),
    ]
    .into_iter()
    .flatten()
    .collect::<Vec<_>>()
    .join("; ")
}

/// `p2p.acs-enabled` for two devices (a GPU pair, or a GPU and its NIC under `area` GDR) from
/// the ACS state between them. `nvlink_unknown` is why NVLink is unknown for a GPU pair whose
/// NVLink the source does not describe: a redirect found on the PCIe path is then unknown, as
/// NVLink would not cross those bridges.
pub(crate) fn acs_finding(
    m: &Machine,
    acs: &Acs,
    area: Area,
    subject: &str,
    nvlink_unknown: Option<&str>,
) -> Finding {
    let id = ids::P2P_ACS_ENABLED;
    let fin = |st: Status, ev: String, rem: &str| finding(id, area, subject, st, ev, rem);
    match acs {
        Acs::NvLink => fin(
            Status::Ok,
            "joined by NVLink: P2P does not cross PCIe bridges, so ACS does not apply".into(),
            "",
        ),
        Acs::TreeUnknown => fin(
            Status::Unknown,
            "the source has no PCI tree: the bridges between the pair are unknown".into(),
            &crate::read_the_machine(
                "the PCI tree and each bridge's ACS control can be read (as root)",
            ),
        ),
        Acs::NoBridge(h) => fin(
            Status::Ok,
            format!(
                "no PCIe bridge between them (both on the root bus {})",
                h.as_deref().unwrap_or("?")
            ),
            "",
        ),
        Acs::NotInSource(bridges) => fin(
            Status::Unknown,
            format!(
                "ACS is not in the source ({}); bridges between them: {}",
                m.coverage
                    .acs
                    .gap()
                    .unwrap_or("it carries no PCI configuration space"),
                bridges.text(ToString::to_string)
            ),
            "run `gdpath doctor` on the machine itself (as root) to read the ACS capability",
        ),
        Acs::Bridges {
            redirect,
            unknown,
            clean,
        } => {
            let remedy = "P2P traffic is sent up to the root complex (slower, and on many \
                          platforms refused): disable ACS on these bridges (`setpci -s BDF \
                          ECAP_ACS+6.w=0` at boot, or the BIOS's ACS/IOMMU settings) on bare \
                          metal; keep it only where the IOMMU must isolate devices (VM \
                          passthrough)";
            let on = redirect.text(|b| {
                format!(
                    "{b} ACS control {} (/sys/bus/pci/devices/{b}/config)",
                    acs_control(m, b)
                )
            });
            if redirect.any {
                match nvlink_unknown {
                    Some(why) => fin(
                        Status::Unknown,
                        format!(
                            "ACS redirects P2P over PCIe, but NVLink is not in the source; on \
                             {on}; over NVLink P2P does not cross these bridges; NVLink \
                             unknown: {why}"
                        ),
                        remedy,
                    ),
                    None => fin(
                        Status::Degraded,
                        format!(
                            "ACS redirects P2P requests and completions to the root complex; \
                             on {on}"
                        ),
                        remedy,
                    ),
                }
            } else if unknown.any {
                fin(
                    Status::Unknown,
                    format!(
                        "ACS unknown (config space past 64 bytes is readable only as root); on \
                         {}{}",
                        unknown.text(ToString::to_string),
                        if clean.any {
                            format!("; no redirect on {}", clean.text(ToString::to_string))
                        } else {
                            String::new()
                        }
                    ),
                    "run as root (or `sudo lspci -vvv`) to read the ACS capability",
                )
            } else {
                fin(
                    Status::Ok,
                    format!(
                        "no ACS redirect (sysfs config); on {}",
                        clean.text(ToString::to_string)
                    ),
                    "",
                )
            }
        }
    }
}
