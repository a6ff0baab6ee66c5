//! System checks: GPUs present, driver and CUDA, kernel, memlock, IOMMU, virtual machine,
//! container.

use super::{bytes, finding, kernel_release, DoctorInput, Gathered};
use gdpath::finding::{ids, Area, Finding, Status};

const A: Area = Area::System;

pub(super) fn check(input: &DoctorInput) -> Vec<Finding> {
    vec![
        no_gpu(input),
        driver(input),
        cuda(input),
        kernel(input),
        memlock(input),
        iommu(input),
        virtual_machine(input),
        container(input),
    ]
}

fn no_gpu(input: &DoctorInput) -> Finding {
    let m = input.machine;
    let n = m.gpus().count();
    if let Some((status, evidence)) = super::gpu_absence(input) {
        finding(
            ids::SYSTEM_NO_GPU,
            A,
            "system",
            status,
            evidence,
            super::no_gpu_remedy(status),
        )
    } else {
        let names: Vec<String> = m.gpus().map(|g| format!("{} {}", g.id, g.pci)).collect();
        finding(
            ids::SYSTEM_NO_GPU,
            A,
            "system",
            Status::Ok,
            format!("{}: {}", super::plural(n, "GPU", "GPUs"), names.join(", ")),
            "",
        )
    }
}

fn driver(input: &DoctorInput) -> Finding {
    let id = ids::SYSTEM_DRIVER;
    let proc_v = input.text("/proc/driver/nvidia/version").and_then(|t| {
        t.lines()
            .find(|l| l.starts_with("NVRM version"))
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
    });
    let facts_v = input.driver.got().and_then(|f| f.driver_version.clone());
    let mut ev = Vec::new();
    if let Some(v) = &facts_v {
        ev.push(format!("NVML driver {v}"));
    }
    if let Some(v) = &proc_v {
        let open = if v.contains("Open Kernel Module") {
            " (open kernel modules)"
        } else {
            ""
        };
        ev.push(format!("/proc/driver/nvidia/version: {v}{open}"));
    }
    if !ev.is_empty() {
        return finding(id, A, "system", Status::Ok, ev.join("; "), "");
    }
    if input.machine.gpus().count() == 0 {
        return finding(
            id,
            A,
            "system",
            Status::Unknown,
            "no GPU, and /proc/driver/nvidia/version absent",
            "run the doctor on a machine with NVIDIA GPUs, their driver loaded",
        );
    }
    let live = !input.is_replay();
    // A replayed source without /proc (hwloc or NCCL XML, a bare sysfs copy) cannot say
    // whether the driver was loaded; a capture with /proc can.
    let evidence = if live {
        "/proc/driver/nvidia/version absent: the NVIDIA kernel driver is not loaded".to_owned()
    } else if [
        "/proc/version",
        "/proc/modules",
        "/proc/cpuinfo",
        "/proc/cmdline",
    ]
    .iter()
    .all(|p| input.view.read(p).is_err())
    {
        // Snapshots hold only what a reader read: probe files, not a listing of /proc.
        format!(
            "the source ({}) has no /proc: whether the NVIDIA kernel driver was loaded is not in it",
            input.machine.source
        )
    } else {
        "/proc/driver/nvidia/version absent in the source: the NVIDIA kernel driver was not \
         loaded when it was captured"
            .to_owned()
    };
    let remedy = if live {
        "install and load the NVIDIA driver (`modprobe nvidia`; `nvidia-smi` should list the GPUs)"
            .to_owned()
    } else if evidence.contains("has no /proc") {
        crate::read_the_machine("/proc/driver/nvidia/version names the loaded driver")
    } else {
        "load the NVIDIA driver (`modprobe nvidia`) and capture the machine again".to_owned()
    };
    finding(
        id,
        A,
        "system",
        if live {
            Status::Unavailable
        } else {
            Status::Unknown
        },
        evidence,
        remedy,
    )
}

fn cuda(input: &DoctorInput) -> Finding {
    let id = ids::SYSTEM_CUDA_MISSING;
    match &input.driver {
        Gathered::Got(f) => {
            let v = f
                .cuda_driver_version
                .map(|v| format!("CUDA driver API {}.{} ({v})", v / 1000, (v % 1000) / 10))
                .unwrap_or_else(|| "CUDA driver API version unknown".to_owned());
            finding(
                id,
                A,
                "system",
                Status::Ok,
                format!(
                    "{v}; {} in the driver facts",
                    super::plural(f.gpus.len(), "GPU", "GPUs")
                ),
                "",
            )
        }
        Gathered::Failed(e) => finding(
            id,
            A,
            "system",
            Status::Unavailable,
            format!("CUDA/NVML could not be used: {e}"),
            "install the NVIDIA driver's user-space libraries (libcuda.so.1, libnvidia-ml.so.1) \
             matching the kernel driver",
        ),
        Gathered::Missing => finding(
            id,
            A,
            "system",
            input.missing_status(),
            input.missing_evidence("CUDA and NVML facts"),
            input.missing_remedy(),
        ),
    }
}

fn kernel(input: &DoctorInput) -> Finding {
    match kernel_release(input) {
        Some((r, file)) => finding(
            ids::SYSTEM_KERNEL,
            A,
            "system",
            Status::Ok,
            format!("Linux {r} ({file})"),
            "",
        ),
        None => finding(
            ids::SYSTEM_KERNEL,
            A,
            "system",
            Status::Unknown,
            "/proc/sys/kernel/osrelease and /proc/version not in the source",
            crate::read_the_machine("/proc/sys/kernel/osrelease gives the running kernel"),
        ),
    }
}

/// `MemTotal` of `/proc/meminfo` in bytes.
fn mem_total(input: &DoctorInput) -> Option<u64> {
    let t = input.text("/proc/meminfo")?;
    let line = t.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

fn memlock(input: &DoctorInput) -> Finding {
    let id = ids::SYSTEM_MEMLOCK_LOW;
    let lim = match &input.memlock {
        Gathered::Got(l) => *l,
        Gathered::Failed(e) => {
            return finding(
                id,
                A,
                "system",
                Status::Unknown,
                format!("getrlimit(RLIMIT_MEMLOCK): {e}"),
                "check the limit in the shell or service that runs the job: `ulimit -l` (unlimited, or at least the memory to register)",
            )
        }
        Gathered::Missing => {
            return finding(
                id,
                A,
                "system",
                input.missing_status(),
                input.missing_evidence("RLIMIT_MEMLOCK of this process"),
                input.missing_remedy(),
            )
        }
    };
    let show = |v: Option<u64>| v.map_or("unlimited".to_owned(), bytes);
    let total = mem_total(input);
    let ev = format!(
        "getrlimit(RLIMIT_MEMLOCK): soft {}, hard {}{}",
        show(lim.soft),
        show(lim.hard),
        total
            .map(|t| format!("; MemTotal {} (/proc/meminfo)", bytes(t)))
            .unwrap_or_default()
    );
    let enough = match (lim.soft, total) {
        (None, _) => true,
        (Some(s), Some(t)) => s >= t,
        (Some(_), None) => false,
    };
    if enough {
        finding(id, A, "system", Status::Ok, ev, "")
    } else {
        finding(
            id,
            A,
            "system",
            Status::Degraded,
            ev,
            "RDMA memory registration pins pages against this limit (ibv_reg_mr fails with \
             ENOMEM past it): set memlock unlimited — `* - memlock unlimited` in \
             /etc/security/limits.conf, LimitMEMLOCK=infinity for systemd services, `--ulimit \
             memlock=-1` for containers",
        )
    }
}

/// Kernel command-line words that set the IOMMU mode.
fn iommu_cmdline(cmdline: &str) -> Vec<&str> {
    cmdline
        .split_whitespace()
        .filter(|w| {
            w.starts_with("iommu")
                || w.starts_with("intel_iommu")
                || w.starts_with("amd_iommu")
                || w.starts_with("iommu.passthrough")
        })
        .collect()
}

fn iommu(input: &DoctorInput) -> Finding {
    let id = ids::SYSTEM_IOMMU;
    let st = &input.machine.iommu;
    let cmd = input.text("/proc/cmdline");
    let words = cmd.as_deref().map(iommu_cmdline).unwrap_or_default();
    let cmd_ev = match &cmd {
        Some(_) if words.is_empty() => "; /proc/cmdline: no iommu options".to_owned(),
        Some(_) => format!("; /proc/cmdline: {}", words.join(" ")),
        None => String::new(),
    };
    match st.enabled() {
        None => finding(
            id,
            A,
            "system",
            Status::Unknown,
            format!("/sys/class/iommu not in the source{cmd_ev}"),
            crate::read_the_machine("/sys/class/iommu and /sys/kernel/iommu_groups show the IOMMU"),
        ),
        Some(false) => finding(
            id,
            A,
            "system",
            Status::Ok,
            format!("off: /sys/class/iommu and /sys/kernel/iommu_groups empty{cmd_ev}"),
            "",
        ),
        Some(true) => {
            let mut counts: std::collections::BTreeMap<&str, usize> = Default::default();
            for g in &st.groups {
                *counts
                    .entry(g.domain_type.as_deref().unwrap_or("unknown"))
                    .or_default() += 1;
            }
            let types: Vec<String> = counts.iter().map(|(t, n)| format!("{n} {t}")).collect();
            let ev = format!(
                "on: units {}; groups by type (/sys/kernel/iommu_groups/N/type): {}{cmd_ev}",
                if st.units.is_empty() {
                    "none".to_owned()
                } else {
                    st.units.join(", ")
                },
                if types.is_empty() {
                    "none".to_owned()
                } else {
                    types.join(", ")
                }
            );
            let translated = st.groups.iter().any(|g| {
                g.domain_type
                    .as_deref()
                    .is_some_and(|t| t.starts_with("DMA"))
            });
            if translated {
                finding(
                    id,
                    A,
                    "system",
                    Status::Degraded,
                    format!("{ev}: translated (DMA) mode"),
                    "GPUDirect P2P over PCIe and GPUDirect RDMA expect the IOMMU off or in \
                     pass-through: boot with `iommu=pt` (and `intel_iommu=on` or `amd_iommu=on` \
                     only where VFIO needs it)",
                )
            } else if st
                .groups
                .iter()
                .all(|g| g.domain_type.as_deref() == Some("identity"))
                && !st.groups.is_empty()
            {
                finding(
                    id,
                    A,
                    "system",
                    Status::Ok,
                    format!("{ev}: pass-through"),
                    "",
                )
            } else {
                finding(
                    id,
                    A,
                    "system",
                    Status::Unknown,
                    format!("{ev}: mode not certain"),
                    "check the mode: /sys/kernel/iommu_groups/*/type (identity is pass-through) and the kernel command line (iommu=pt)",
                )
            }
        }
    }
}

fn virtual_machine(input: &DoctorInput) -> Finding {
    let id = ids::SYSTEM_VIRTUAL_MACHINE;
    let m = input.machine;
    let Some(cpuinfo) = input.text("/proc/cpuinfo") else {
        return finding(
            id,
            A,
            "system",
            Status::Unknown,
            "/proc/cpuinfo not in the source",
            crate::read_the_machine("/proc/cpuinfo shows a hypervisor"),
        );
    };
    let hyper = cpuinfo
        .lines()
        .filter(|l| l.starts_with("flags"))
        .any(|l| l.split_whitespace().any(|w| w == "hypervisor"));
    let mut signs = Vec::new();
    if hyper {
        signs.push("/proc/cpuinfo flags include `hypervisor`".to_owned());
    }
    if let Some(v) = input.text("/sys/class/dmi/id/sys_vendor") {
        if [
            "QEMU",
            "KVM",
            "Microsoft",
            "Amazon EC2",
            "Google",
            "VMware",
            "Xen",
            "innotek",
        ]
        .iter()
        .any(|k| v.contains(k))
        {
            signs.push(format!("/sys/class/dmi/id/sys_vendor: {v}"));
        }
    }
    let gpus: Vec<_> = m.gpus().collect();
    if !gpus.is_empty() && m.tree_known && gpus.iter().all(|g| g.parent.is_none()) {
        signs.push(
            "every GPU sits directly on a root bus (flat PCI tree, no root port or switch above)"
                .to_owned(),
        );
    }
    let devs = m.matrix_devices();
    if !devs.is_empty() && devs.iter().all(|d| d.numa.is_none()) {
        signs.push("numa_node -1 on every GPU/NIC/NVMe".to_owned());
    }
    if hyper || signs.len() >= 2 {
        finding(
            id,
            A,
            "system",
            Status::Unknown,
            format!("virtual machine: {}", signs.join("; ")),
            "the PCI tree, ACS, link speeds and NUMA the guest sees are the hypervisor's: P2P and \
             GDR also depend on the host (its ACS and IOMMU settings, ATS, and whether it lets \
             passthrough devices reach each other); ask the provider or check on the host",
        )
    } else {
        finding(
            id,
            A,
            "system",
            Status::Ok,
            format!(
                "no hypervisor flag in /proc/cpuinfo{}",
                if signs.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", signs.join("; "))
                }
            ),
            "",
        )
    }
}

fn container(input: &DoctorInput) -> Finding {
    let id = ids::SYSTEM_CONTAINER;
    let mut signs = Vec::new();
    for f in ["/.dockerenv", "/run/.containerenv"] {
        if input.view.read(f).is_ok() {
            signs.push(format!("{f} exists"));
        }
    }
    let cg = input
        .text("/proc/1/cgroup")
        .map(|t| (t, "/proc/1/cgroup"))
        .or_else(|| {
            input
                .text("/proc/self/cgroup")
                .map(|t| (t, "/proc/self/cgroup"))
        });
    if let Some((t, f)) = &cg {
        const KEYS: [&str; 6] = ["docker", "kubepods", "containerd", "libpod", "lxc", "crio"];
        if let Some(l) = t.lines().find(|l| KEYS.iter().any(|k| l.contains(k))) {
            signs.push(format!("{f}: {l}"));
        }
    }
    if !signs.is_empty() {
        finding(
            id,
            A,
            "system",
            Status::Unknown,
            format!("container: {}", signs.join("; ")),
            "inside a container /sys/module and /proc/driver show the host's modules, the \
             memlock limit is the runtime's, and devices not passed in are hidden (RDMA devices \
             need --device=/dev/infiniband, GDS needs /dev/nvidia-fs*): run the doctor on the \
             host too",
        )
    } else if cg.is_none() && input.view.read("/proc/cpuinfo").is_err() {
        finding(
            id,
            A,
            "system",
            Status::Unknown,
            "no /proc in the source",
            crate::read_the_machine("/proc shows whether it runs in a container"),
        )
    } else {
        finding(
            id,
            A,
            "system",
            Status::Ok,
            format!(
                "no container signs (/.dockerenv, /run/.containerenv, {})",
                cg.map_or("no cgroup file".to_owned(), |(_, f)| format!(
                    "{f} without runtime names"
                ))
            ),
            "",
        )
    }
}
