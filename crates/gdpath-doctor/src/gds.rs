//! GDS checks: nvidia-fs, cuFile and its configuration, and per `--path` directory the file
//! system, O_DIRECT, the block device behind it, and whether cuFile will run native.

use super::{finding, DoctorInput, Gathered, OdirectProbe, PathInput, PathProbe};
use gdpath::cufile_json::CufileConfig;
use gdpath::finding::{ids, Area, Finding, Status};
use gdpath::gds::GdsFacts;
use gdpath_topo::{Device, DeviceKind, LinkClass, PciAddr};

const A: Area = Area::Gds;

/// `statfs(2)` `f_type` magics (linux/magic.h and the file systems' own headers).
pub mod magic {
    pub const EXT4: u64 = 0xEF53;
    pub const XFS: u64 = 0x5846_5342;
    pub const TMPFS: u64 = 0x0102_1994;
    pub const OVERLAYFS: u64 = 0x794C_7630;
    pub const BTRFS: u64 = 0x9123_683E;
    pub const NFS: u64 = 0x6969;
    pub const LUSTRE: u64 = 0x0BD0_0BD0;
    pub const GPFS: u64 = 0x4750_4653;
    pub const BEEGFS: u64 = 0x1983_0326;
    pub const ZFS: u64 = 0x2FC1_2FC1;
    pub const SQUASHFS: u64 = 0x7371_7368;
    pub const FUSE: u64 = 0x6573_5546;
    pub const CIFS: u64 = 0xFF53_4D42;
    pub const SMB2: u64 = 0xFE53_4D42;
    pub const CEPH: u64 = 0x00C3_6400;
    pub const WEKAFS: u64 = 0x5745_4B41;
}

/// What nvidia-fs does with a file system: (name, native GDS possible).
/// Supported list: nvidia-fs documentation, "Key Features" — ext4 in ordered mode and XFS on
/// NVMe/NVMe-oF, NFS over RDMA, and RDMA distributed file systems (EXAScaler/Lustre, WekaFS,
/// VAST over NFS, IBM Spectrum Scale/GPFS, BeeGFS). Anything else is compatibility mode only.
pub fn fs_support(m: u64) -> (&'static str, Option<bool>) {
    use magic::*;
    match m {
        EXT4 => ("ext4", Some(true)),
        XFS => ("xfs", Some(true)),
        LUSTRE => ("lustre", Some(true)),
        GPFS => ("gpfs", Some(true)),
        BEEGFS => ("beegfs", Some(true)),
        WEKAFS => ("wekafs", Some(true)),
        // Only NFS over RDMA (VAST, NetApp) is supported: the mount options decide.
        NFS => ("nfs", None),
        TMPFS => ("tmpfs", Some(false)),
        OVERLAYFS => ("overlayfs", Some(false)),
        BTRFS => ("btrfs", Some(false)),
        ZFS => ("zfs", Some(false)),
        SQUASHFS => ("squashfs", Some(false)),
        FUSE => ("fuse", Some(false)),
        CIFS | SMB2 => ("cifs/smb", Some(false)),
        CEPH => ("ceph", Some(false)),
        _ => ("unknown", None),
    }
}

pub(super) fn check(input: &DoctorInput) -> Vec<Finding> {
    let facts = GdsFacts::gather(input.view, input.env(gdpath::gds::CUFILE_ENV));
    let nvfs = nvidia_fs(input, &facts);
    let cufile = cufile(input);
    let (config, cfg_finding) = config(input, &facts);
    let mut out: Vec<Finding> = super::no_gpu(input, A).into_iter().collect();
    out.extend([nvfs.0.clone(), cufile.clone(), cfg_finding]);
    for p in &input.paths {
        out.extend(per_path(input, p, nvfs.1, &cufile, config.as_ref()));
    }
    out
}

/// gds.nvidia-fs-missing, and whether nvidia-fs is loaded, from the facts the engine's GDS
/// decision uses ([`GdsFacts::gather`]).
fn nvidia_fs(input: &DoctorInput, facts: &GdsFacts) -> (Finding, Option<bool>) {
    let id = ids::GDS_NVIDIA_FS_MISSING;
    if let Some(v) = &facts.nvidia_fs_version {
        return (
            finding(
                id,
                A,
                "system",
                Status::Ok,
                format!("/proc/driver/nvidia-fs/version: {v}"),
                "",
            ),
            Some(true),
        );
    }
    let modules = match facts.nvidia_fs_module {
        Some(_) => facts.nvidia_fs_evidence.clone(),
        None => super::modules_unknown(input),
    };
    let ev = format!("/proc/driver/nvidia-fs/version absent; {modules}");
    match facts.nvidia_fs_module {
        Some(true) => (finding(id, A, "system", Status::Ok, ev, ""), Some(true)),
        Some(false) => (
            finding(
                id,
                A,
                "system",
                Status::Degraded,
                format!("nvidia-fs not loaded; {ev}"),
                "native GDS needs the nvidia-fs kernel module (`modprobe nvidia_fs`; package \
                 nvidia-fs or nvidia-gds with the NVIDIA open kernel modules); without it cuFile \
                 runs in compatibility mode where allowed, or in P2PDMA mode where configured",
            ),
            Some(false),
        ),
        None => (
            finding(
                id,
                A,
                "system",
                Status::Unknown,
                format!("whether nvidia-fs is loaded is unknown; {ev}"),
                crate::read_the_machine(
                    "/proc/driver/nvidia-fs and /sys/module show whether nvidia-fs is loaded",
                ),
            ),
            None,
        ),
    }
}

fn cufile(input: &DoctorInput) -> Finding {
    let id = ids::GDS_CUFILE_MISSING;
    let remedy = "install cuFile (libcufile.so.0: the CUDA toolkit's libcufile, the \
                  nvidia-cufile wheels, or the gds-tools package)";
    match &input.cufile {
        Gathered::Got(c) if c.library_found => {
            let mut ev = format!(
                "libcufile {} loaded",
                c.version.as_deref().unwrap_or("(version ?)")
            );
            match &c.driver_open_error {
                Some(e) => {
                    ev.push_str(&format!("; cuFileDriverOpen failed: {e}"));
                    finding(
                        id,
                        A,
                        "system",
                        Status::Unavailable,
                        ev,
                        "see cufile.log (logging.dir in cufile.json) for cuFile's reason",
                    )
                }
                None => {
                    ev.push_str("; cuFileDriverOpen ok");
                    finding(id, A, "system", Status::Ok, ev, "")
                }
            }
        }
        Gathered::Got(_) => finding(
            id,
            A,
            "system",
            Status::Unavailable,
            "libcufile not found",
            remedy,
        ),
        Gathered::Failed(e) => finding(
            id,
            A,
            "system",
            Status::Unavailable,
            format!("libcufile: {e}"),
            remedy,
        ),
        Gathered::Missing => finding(
            id,
            A,
            "system",
            input.missing_status(),
            input.missing_evidence("cuFile"),
            input.missing_remedy(),
        ),
    }
}

/// The `cufile.json` in force (as [`GdsFacts::gather`] locates it), through the view.
fn config(input: &DoctorInput, facts: &GdsFacts) -> (Option<CufileConfig>, Finding) {
    let id = ids::GDS_CUFILE_CONFIG;
    let path = facts.cufile_json.path.to_string_lossy().into_owned();
    let why = if facts.cufile_json.from_env {
        gdpath::gds::CUFILE_ENV
    } else {
        "default location"
    };
    let force = input
        .env("CUFILE_FORCE_COMPAT_MODE")
        .map(|v| format!("; CUFILE_FORCE_COMPAT_MODE={v}"))
        .unwrap_or_default();
    let Ok(bytes) = input.view.read(&path) else {
        return (
            None,
            finding(
                id,
                A,
                "system",
                if input.is_replay() {
                    Status::NotRun
                } else {
                    Status::Ok
                },
                format!(
                    "{path} ({why}) not found{}{force}",
                    if input.is_replay() {
                        " in the capture"
                    } else {
                        ": cuFile uses its built-in defaults"
                    }
                ),
                if input.is_replay() {
                    "run `gdpath doctor` on the machine itself to read the cufile.json in force \
                     (a capture holds it only when it exists)"
                } else {
                    ""
                },
            ),
        );
    };
    let text = String::from_utf8_lossy(&bytes);
    match CufileConfig::parse(&text) {
        Ok(c) => {
            let show = |v: Option<String>| v.unwrap_or_else(|| "unset".to_owned());
            let ev = format!(
                "{path} ({why}): allow_compat_mode {}, max_direct_io_size_kb {}, use_pci_p2pdma {}, \
                 posix_unaligned_writes {}{force}",
                show(c.allow_compat_mode.map(|b| b.to_string())),
                show(c.max_direct_io_size_kb.map(|b| b.to_string())),
                show(c.use_pci_p2pdma.map(|b| b.to_string())),
                show(c.posix_unaligned_writes.map(|b| b.to_string())),
            );
            (Some(c), finding(id, A, "system", Status::Ok, ev, ""))
        }
        Err(e) => (
            None,
            finding(
                id,
                A,
                "system",
                Status::Unknown,
                format!("{path} ({why}) is not valid: {e}"),
                "fix the file (cuFile reads it at cuFileDriverOpen and logs parse errors to \
                 cufile.log)",
            ),
        ),
    }
}

/// The block device behind a device number, through sysfs.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockInfo {
    /// `nvme0n1p1`, `dm-0`, `vda`.
    pub name: String,
    /// Canonical sysfs path.
    pub sysfs: String,
    /// For device-mapper volumes: `dm/name` (e.g. `vg0-data`) and the devices under it.
    pub dm: Option<(String, Vec<String>)>,
    /// The PCI function the disk sits on (the NVMe controller), when on PCI.
    pub pci: Option<PciAddr>,
    pub nvme: bool,
}

/// Resolves (major, minor) to its block device: `/sys/dev/block/M:m`, else a scan of
/// `/sys/class/block/*/dev` (older dumps have no `/sys/dev`).
pub fn block_device(view: &dyn gdpath_topo::SysView, dev: (u32, u32)) -> Option<BlockInfo> {
    let mm = format!("{}:{}", dev.0, dev.1);
    let canonical = view
        .read_link(&format!("/sys/dev/block/{mm}"))
        .ok()
        .and_then(|_| view.resolve(&format!("/sys/dev/block/{mm}")).ok())
        .or_else(|| {
            view.read_dir("/sys/class/block")
                .ok()?
                .into_iter()
                .find_map(|n| {
                    (view.read_text(&format!("/sys/class/block/{n}/dev"))? == mm)
                        .then(|| view.resolve(&format!("/sys/class/block/{n}")).ok())
                        .flatten()
                })
        })?;
    let name = canonical.rsplit('/').next()?.to_owned();
    let dm = view.read_text(&format!("{canonical}/dm/name")).map(|n| {
        (
            n,
            view.read_dir(&format!("{canonical}/slaves"))
                .unwrap_or_default(),
        )
    });
    let pci = canonical
        .split('/')
        .filter_map(|c| c.parse::<PciAddr>().ok())
        .next_back();
    let nvme = canonical.contains("/nvme/") || name.starts_with("nvme");
    Some(BlockInfo {
        name,
        sysfs: canonical,
        dm,
        pci,
        nvme,
    })
}

fn per_path(
    input: &DoctorInput,
    p: &PathInput,
    nvfs: Option<bool>,
    cufile: &Finding,
    config: Option<&CufileConfig>,
) -> Vec<Finding> {
    let s = p.path.display().to_string();
    let mut out = Vec::new();
    // Reasons cuFile cannot run native here, with the finding id that says so.
    let mut compat: Vec<String> = Vec::new();
    let mut unknown: Vec<String> = Vec::new();
    if nvfs == Some(false) {
        compat.push(ids::GDS_NVIDIA_FS_MISSING.to_owned());
    }
    if let Some(v) = input.env("CUFILE_FORCE_COMPAT_MODE") {
        if v.eq_ignore_ascii_case("true") || v == "1" {
            compat.push(format!("CUFILE_FORCE_COMPAT_MODE={v}"));
        }
    }

    match &p.probe {
        Gathered::Got(probe) => {
            out.extend(probe_findings(input, &s, probe, &mut compat, &mut unknown));
        }
        other => {
            let (st, ev, remedy) = match other {
                Gathered::Failed(e) => (
                    Status::Unknown,
                    format!("probe failed: {e}"),
                    "check that the directory exists and can be read",
                ),
                _ => (
                    input.missing_status(),
                    input.missing_evidence("file system, O_DIRECT and block device probe"),
                    input.missing_remedy(),
                ),
            };
            for id in [ids::GDS_FS_UNSUPPORTED, ids::STORAGE_ODIRECT_UNSUPPORTED] {
                out.push(finding(id, A, &s, st, &ev, remedy));
            }
            unknown.push("the path was not probed".to_owned());
        }
    }

    // gds.handle-register-failed: cuFile's own answer for this path.
    let reg = match &input.cufile {
        Gathered::Got(c) => c.handle_register.get(&p.path).cloned(),
        _ => None,
    };
    let id = ids::GDS_HANDLE_REGISTER_FAILED;
    let mut refused = None;
    match reg {
        Some(None) => out.push(finding(
            id,
            A,
            &s,
            Status::Ok,
            "cuFileHandleRegister succeeded on a file in this directory",
            "",
        )),
        Some(Some(e)) => {
            refused = Some(e.clone());
            out.push(finding(
                id,
                A,
                &s,
                Status::Unavailable,
                format!("cuFileHandleRegister: {e}"),
                "cuFile cannot use files in this directory: check cufile.log, the file system and block \
                 device findings for this path, and that the device is known to udev \
                 (virtual disks without udev data are refused)",
            ))
        }
        None => {
            let (st, ev, remedy) = if cufile.status == Status::Unavailable {
                (
                    Status::Unavailable,
                    format!(
                        "not attempted: cuFile is unavailable (see {})",
                        ids::GDS_CUFILE_MISSING
                    ),
                    "install cuFile first (gds.cufile-missing says how)",
                )
            } else {
                (
                    input.missing_status(),
                    input.missing_evidence("cuFileHandleRegister"),
                    input.missing_remedy(),
                )
            };
            if st == Status::Unavailable {
                refused = Some(ev.clone());
            }
            out.push(finding(id, A, &s, st, ev, remedy));
        }
    }

    // gds.compat-mode: native, compatibility, or nothing.
    let id = ids::GDS_COMPAT_MODE;
    let allow = config.and_then(|c| c.allow_compat_mode);
    let p2pdma = config.and_then(|c| c.use_pci_p2pdma) == Some(true);
    out.push(if let Some(e) = refused {
        finding(
            id,
            A,
            &s,
            Status::Unavailable,
            format!("cuFile will not run in this directory, native or compat: {e}"),
            "use the POSIX path (gdpath falls back to O_DIRECT/buffered I/O into pinned memory)",
        )
    } else if !compat.is_empty() && allow == Some(false) {
        finding(
            id,
            A,
            &s,
            Status::Unavailable,
            format!(
                "native GDS impossible ({}) and cufile.json sets allow_compat_mode false",
                compat.join(", ")
            ),
            "set properties.allow_compat_mode true in cufile.json, or fix the causes listed",
        )
    } else if !compat.is_empty() && p2pdma && compat == [ids::GDS_NVIDIA_FS_MISSING] {
        finding(
            id,
            A,
            &s,
            Status::Unknown,
            "nvidia-fs missing but cufile.json asks for PCI P2PDMA mode: cuFile decides at \
             cuFileDriverOpen (P2PDMA needs a recent kernel, NVMe and the open GPU modules)",
            "cuFile's log (cufile.log) says which mode it took; load nvidia-fs for native GDS where P2PDMA is not supported",
        )
    } else if !compat.is_empty() {
        finding(
            id,
            A,
            &s,
            Status::Degraded,
            format!(
                "cuFile runs in compatibility mode in this directory (POSIX I/O through its bounce \
                 buffers): {}",
                compat.join(", ")
            ),
            "fix the listed causes for native GDS (each id above has its remedy)",
        )
    } else if !unknown.is_empty() || nvfs.is_none() {
        finding(
            id,
            A,
            &s,
            if input.is_replay() {
                Status::NotRun
            } else {
                Status::Unknown
            },
            format!(
                "cannot tell native from compat: {}",
                if unknown.is_empty() {
                    "nvidia-fs state unknown".to_owned()
                } else {
                    unknown.join("; ")
                }
            ),
            if input.is_replay() { input.missing_remedy() } else { "settle the unknowns listed (each id above has its remedy)" },
        )
    } else {
        finding(
            id,
            A,
            &s,
            Status::Ok,
            "nvidia-fs loaded, file system and device supported: cuFile runs native",
            "",
        )
    });
    out
}

fn probe_findings(
    input: &DoctorInput,
    s: &str,
    probe: &PathProbe,
    compat: &mut Vec<String>,
    unknown: &mut Vec<String>,
) -> Vec<Finding> {
    let mut out = Vec::new();
    // File system type.
    let id = ids::GDS_FS_UNSUPPORTED;
    match probe.fs_magic {
        Some(m) => {
            let (name, native) = fs_support(m);
            let ev = format!("statfs f_type 0x{m:X} ({name})");
            match native {
                Some(true) => {
                    let ordered = ext4_data_mode(input, probe.dev);
                    if name == "ext4" && ordered.as_deref().is_some_and(|d| d != "ordered") {
                        compat.push(id.to_owned());
                        out.push(finding(
                            id,
                            A,
                            s,
                            Status::Degraded,
                            format!("{ev}, mounted data={} (/proc/self/mountinfo)", ordered.unwrap_or_default()),
                            "nvidia-fs supports ext4 only in data=ordered mode: remount without data=journal/writeback",
                        ));
                    } else {
                        out.push(finding(
                            id,
                            A,
                            s,
                            Status::Ok,
                            format!("{ev}: supported by nvidia-fs"),
                            "",
                        ));
                    }
                }
                Some(false) => {
                    compat.push(id.to_owned());
                    out.push(finding(
                        id,
                        A,
                        s,
                        Status::Degraded,
                        format!("{ev}: not supported by nvidia-fs"),
                        "native GDS needs ext4 (data=ordered) or XFS on NVMe/NVMe-oF, NFS over \
                         RDMA, or a GDS-enabled distributed file system (Lustre, GPFS, WekaFS, \
                         BeeGFS, VAST)",
                    ));
                }
                None => {
                    unknown.push(format!("file system {name}"));
                    out.push(finding(
                        id,
                        A,
                        s,
                        Status::Unknown,
                        format!("{ev}: native support depends on the transport (NFS only over RDMA) or is not known to gdpath"),
                        "for native GDS use ext4 or XFS on local NVMe, NFS over RDMA, or a GDS-enabled distributed file system (Lustre, GPFS, WekaFS, BeeGFS, VAST)",
                    ));
                }
            }
        }
        None => {
            unknown.push("file system type".to_owned());
            out.push(finding(
                id,
                A,
                s,
                Status::Unknown,
                "statfs failed",
                "check that the directory exists and can be read (statfs failed on it)",
            ));
        }
    }

    // O_DIRECT.
    let id = ids::STORAGE_ODIRECT_UNSUPPORTED;
    out.push(match &probe.odirect {
        OdirectProbe::Works => finding(
            id,
            A,
            s,
            Status::Ok,
            "open(O_CREAT|O_DIRECT) of a temporary file succeeded",
            "",
        ),
        OdirectProbe::NotTested(e) => {
            unknown.push("O_DIRECT".to_owned());
            finding(
                id,
                A,
                s,
                Status::Unknown,
                format!("no file can be created in this directory to test O_DIRECT: {e}"),
                "pass a writable --path",
            )
        }
        OdirectProbe::Refused(e) => {
            compat.push(id.to_owned());
            finding(
                id,
                A,
                s,
                Status::Degraded,
                format!("open(O_CREAT|O_DIRECT) failed: {e}"),
                "this file system refuses O_DIRECT (tmpfs before Linux 6.6, overlayfs on old \
                 kernels, some network file systems): reads and writes go through the page \
                 cache; use a path on ext4/XFS for direct I/O",
            )
        }
    });

    // Block device.
    let Some(dev) = probe.dev else {
        unknown.push("device number".to_owned());
        return out;
    };
    if dev.0 == 0 {
        // Anonymous device: tmpfs, overlayfs, NFS, ... — no block device to judge.
        out.push(finding(
            ids::GDS_NOT_NVME,
            A,
            s,
            if compat.iter().any(|c| c == ids::GDS_FS_UNSUPPORTED) {
                Status::Degraded
            } else {
                Status::Unknown
            },
            format!(
                "st_dev {}:{}: no block device (memory or network file system)",
                dev.0, dev.1
            ),
            "for native GDS keep the files on a file system on local NVMe (or one GDS supports over the network)",
        ));
        return out;
    }
    let Some(b) = block_device(input.view, dev) else {
        unknown.push("block device".to_owned());
        out.push(finding(
            ids::GDS_NOT_NVME,
            A,
            s,
            Status::Unknown,
            format!(
                "st_dev {}:{}: no /sys/dev/block/{}:{} or /sys/class/block entry",
                dev.0, dev.1, dev.0, dev.1
            ),
            "check /sys/dev/block on the machine: native GDS needs the file system on an NVMe drive",
        ));
        return out;
    };
    let id = ids::GDS_DEVICE_MAPPER;
    if let Some((dm_name, slaves)) = &b.dm {
        compat.push(id.to_owned());
        out.push(finding(
            id,
            A,
            s,
            Status::Degraded,
            format!(
                "{} ({}/dm/name {dm_name}) over {}",
                b.name,
                b.sysfs,
                if slaves.is_empty() {
                    "?".to_owned()
                } else {
                    slaves.join(", ")
                }
            ),
            "nvidia-fs does not support device-mapper volumes (LVM, dm-crypt, multipath): put \
             the data on a plain NVMe partition (or an mdraid/RAID volume GDS supports) for \
             native GDS",
        ));
        return out;
    }
    out.push(finding(
        id,
        A,
        s,
        Status::Ok,
        format!("{} is not a device-mapper volume ({})", b.name, b.sysfs),
        "",
    ));

    let id = ids::GDS_NOT_NVME;
    if !b.nvme {
        compat.push(id.to_owned());
        out.push(finding(
            id,
            A,
            s,
            Status::Degraded,
            format!("{} is not an NVMe namespace ({})", b.name, b.sysfs),
            "native GDS reads NVMe (local or NVMe-oF) or RDMA file systems: put the data on NVMe",
        ));
        return out;
    }
    out.push(finding(
        id,
        A,
        s,
        Status::Ok,
        format!("{} is an NVMe namespace ({})", b.name, b.sysfs),
        "",
    ));
    out.extend(nvme_far(input, s, &b));
    out
}

/// ext4's `data=` mode of the mount with device `dev`, from `/proc/self/mountinfo`'s super
/// options; `Some("ordered")` when the option is absent (ext4's default).
fn ext4_data_mode(input: &DoctorInput, dev: Option<(u32, u32)>) -> Option<String> {
    let (ma, mi) = dev?;
    let info = input.text("/proc/self/mountinfo")?;
    let want = format!("{ma}:{mi}");
    let line = info
        .lines()
        .find(|l| l.split_whitespace().nth(2) == Some(&want))?;
    let after = line.split(" - ").nth(1)?;
    let opts = after.split_whitespace().nth(2).unwrap_or("");
    Some(
        opts.split(',')
            .find_map(|o| o.strip_prefix("data="))
            .unwrap_or("ordered")
            .to_owned(),
    )
}

/// gds.nvme-far: the NVMe controller's PCIe class to each GPU.
fn nvme_far(input: &DoctorInput, s: &str, b: &BlockInfo) -> Vec<Finding> {
    let m = input.machine;
    let Some(nvme) = b.pci.and_then(|p| m.device(&p)) else {
        return vec![finding(
            ids::GDS_NVME_FAR,
            A,
            s,
            Status::Unknown,
            format!(
                "{} is not on a PCI function in the machine (NVMe-oF?)",
                b.name
            ),
            "not a local NVMe drive: over NVMe-oF the data crosses an RDMA NIC, so keep that NIC near the GPU (gdr.nic-far)",
        )];
    };
    m.gpus()
        .map(|g| nvme_class_finding(s, g, nvme, m.pcie_class(g, nvme)))
        .collect()
}

fn nvme_class_finding(s: &str, g: &Device, nvme: &Device, class: LinkClass) -> Finding {
    let id = ids::GDS_NVME_FAR;
    let subject = format!("{s}: {}-{}", g.id, nvme.id);
    let kind = if nvme.kind == DeviceKind::Nvme {
        "NVMe"
    } else {
        "device"
    };
    match class {
        LinkClass::Pix | LinkClass::Pxb => finding(
            id,
            A,
            subject,
            Status::Ok,
            format!(
                "{kind} {} at {class} from {}: DMA stays below the CPU",
                nvme.pci, g.id
            ),
            "",
        ),
        LinkClass::Unknown | LinkClass::X | LinkClass::Nv(_) => finding(
            id,
            A,
            subject,
            Status::Unknown,
            format!("{kind} {} class {class} from {}", nvme.pci, g.id),
            crate::PAIR_CLASS_UNKNOWN,
        ),
        c => finding(
            id,
            A,
            subject,
            Status::Degraded,
            format!(
                "{kind} {} at {c} from {}: GDS DMA goes through the CPU's root complex{}",
                nvme.pci,
                g.id,
                if c == LinkClass::Sys {
                    " and across sockets"
                } else {
                    ""
                }
            ),
            "for full GDS bandwidth read with a GPU under the same PCIe switch as the NVMe \
             (PIX/PXB); pick the GPU nearest to the drive (`gdpath topo`)",
        ),
    }
}
