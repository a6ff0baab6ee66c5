//! The doctor on the real hwloc sysfs dumps, and on dumps derived from them with one condition
//! changed (each derivation is described where it is made).

mod doctor_common;
use doctor_common::*;
use gdpath::finding::ids;
use gdpath::{Area, Status};
use gdpath_doctor::{Gathered, Memlock, OdirectProbe, PathInput, PathProbe};
use std::path::PathBuf;

#[test]
fn sandy_bridge_without_gpu() {
    let (_t, top) = unpack_sysfs(SANDY);
    let r = doctor_on(&top, |_| {});
    assert_eq!(r.mode, "replay");
    // No GPU: system.no-gpu, and P2P/GDR/GDS unavailable because of it.
    assert_eq!(
        status(&r, ids::SYSTEM_NO_GPU, "system"),
        Status::Unavailable
    );
    assert_eq!(
        status(&r, ids::P2P_UNSUPPORTED, "system"),
        Status::Unavailable
    );
    let gdr_no_gpu = r
        .of(Area::Gdr)
        .find(|f| f.id.as_str() == ids::SYSTEM_NO_GPU)
        .unwrap();
    assert_eq!(gdr_no_gpu.status, Status::Unavailable);
    assert_eq!(r.verdict(Area::Gds).unwrap().status, Status::Unavailable);
    // The ConnectX-3 is an RDMA device (mlx4_0 on 0000:82:00.0).
    let f = find(&r, ids::GDR_NO_RDMA_DEVICE, "system");
    assert_eq!(f.status, Status::Ok);
    assert!(f.evidence.contains("mlx4_0 on NIC"), "{}", f.evidence);
    // Bare metal (no hypervisor flag), no container signs in the dump.
    assert_eq!(
        status(&r, ids::SYSTEM_VIRTUAL_MACHINE, "system"),
        Status::Ok
    );
    // The dump has neither /sys/class/iommu nor a kernel release.
    assert_eq!(status(&r, ids::SYSTEM_IOMMU, "system"), Status::Unknown);
    assert_eq!(status(&r, ids::SYSTEM_KERNEL, "system"), Status::Unknown);
    // Live-only facts are not run in a replay.
    assert_eq!(
        status(&r, ids::SYSTEM_MEMLOCK_LOW, "system"),
        Status::NotRun
    );
    assert_eq!(
        status(&r, ids::SYSTEM_CUDA_MISSING, "system"),
        Status::NotRun
    );
    assert_eq!(
        status(&r, ids::GDS_CUFILE_MISSING, "system"),
        Status::NotRun
    );
    assert_eq!(status(&r, ids::GDR_UCX_NO_CUDA, "system"), Status::NotRun);
    assert_eq!(r.exit_code(), 2);
}

#[test]
fn qemu_vm_is_detected() {
    let (_t, top) = unpack_sysfs(QEMU);
    let r = doctor_on(&top, |_| {});
    let f = find(&r, ids::SYSTEM_VIRTUAL_MACHINE, "system");
    assert_eq!(f.status, Status::Unknown);
    assert!(f.evidence.contains("hypervisor"), "{}", f.evidence);
    assert!(!f.remedy.is_empty());
    // No /sys/class/infiniband in this VM: no RDMA device.
    assert_eq!(
        status(&r, ids::GDR_NO_RDMA_DEVICE, "system"),
        Status::Unavailable
    );
}

#[test]
fn power9_gpus_without_tree_or_driver_facts() {
    let (_t, top) = unpack_sysfs(POWER9);
    let r = doctor_on(&top, |_| {});
    // Six V100 (listed by the NVIDIA driver), no PCI tree, no driver facts in a replay.
    assert_eq!(status(&r, ids::SYSTEM_NO_GPU, "system"), Status::Ok);
    assert_eq!(
        status(&r, ids::P2P_UNSUPPORTED, "GPU0-GPU1"),
        Status::NotRun
    );
    assert_eq!(
        status(&r, ids::P2P_ACS_ENABLED, "GPU0-GPU1"),
        Status::Unknown
    );
    // Kernel 4.14 from /proc/version: too old for dma-buf GDR.
    let k = find(&r, ids::SYSTEM_KERNEL, "system");
    assert!(
        k.evidence.contains("4.14.0-49") && k.evidence.contains("/proc/version"),
        "{}",
        k.evidence
    );
    // That rules out dma-buf, but nvidia_peermem is the other GDR route and the dump
    // has neither /sys/module nor /proc/modules: GDR is unknown, not unavailable (one route ruled
    // out does not rule out the other).
    let d = find(&r, ids::GDR_DMABUF_UNAVAILABLE, "system");
    assert_eq!(d.status, Status::Unknown, "{}", d.evidence);
    assert!(
        d.evidence.contains("< 5.12") && d.evidence.contains("nvidia_peermem"),
        "{}",
        d.evidence
    );
    let p = find(&r, ids::GDR_PEERMEM_MISSING, "system");
    assert_eq!(p.status, Status::Unknown);
    // Said as other replay findings say what the source lacks, not as a live read failure.
    assert!(
        p.evidence
            .contains("/sys/module and /proc/modules not in the source")
            && !p.evidence.contains("not readable"),
        "{}",
        p.evidence
    );
    let nvfs = find(&r, ids::GDS_NVIDIA_FS_MISSING, "system");
    assert!(
        nvfs.evidence.contains("not in the source") && !nvfs.evidence.contains("not readable"),
        "{}",
        nvfs.evidence
    );
    assert_eq!(r.verdict(Area::Gdr).unwrap().status, Status::Unknown);
    assert_eq!(r.exit_code(), 4, "nothing decided");
    // /proc/self/cgroup of a login session: no container.
    let c = find(&r, ids::SYSTEM_CONTAINER, "system");
    assert_eq!(c.status, Status::Ok, "{}", c.evidence);
    // A replayed machine with GPUs but no /proc/driver/nvidia/version: unknown, not "missing".
    assert_eq!(status(&r, ids::SYSTEM_DRIVER, "system"), Status::Unknown);
}

/// Derived: the POWER9 dump (kernel 4.14, too old for dma-buf GDR) with `/proc/modules` added,
/// first without a peer-memory module (GDR unavailable: neither route), then with
/// `nvidia_peermem` listed (dma-buf is not needed: the finding passes, and what decides GDR is
/// the peer-memory route's own state, here `memory_peers` absent).
#[test]
fn power9_dmabuf_ruled_out_and_peermem_known() {
    let (_t, top) = unpack_sysfs(POWER9);
    let line = |m: &str| format!("{m} 16384 0 - Live 0x0000000000000000\n");
    write(&top, "proc/modules", line("nvidia"));
    let r = doctor_on(&top, |_| {});
    let d = find(&r, ids::GDR_DMABUF_UNAVAILABLE, "system");
    assert_eq!(d.status, Status::Unavailable, "{}", d.evidence);
    assert!(
        d.evidence.contains("no peer-memory module"),
        "{}",
        d.evidence
    );
    assert_eq!(
        status(&r, ids::GDR_PEERMEM_MISSING, "system"),
        Status::Unavailable
    );
    assert_eq!(r.verdict(Area::Gdr).unwrap().status, Status::Unavailable);

    write(
        &top,
        "proc/modules",
        format!("{}{}", line("nvidia"), line("nvidia_peermem")),
    );
    let r = doctor_on(&top, |_| {});
    let d = find(&r, ids::GDR_DMABUF_UNAVAILABLE, "system");
    assert_eq!(d.status, Status::Ok, "{}", d.evidence);
    assert!(
        d.evidence.contains("< 5.12") && d.evidence.contains("nvidia_peermem is loaded"),
        "{}",
        d.evidence
    );
    assert!(d.remedy.is_empty());
    assert_eq!(status(&r, ids::GDR_PEERMEM_MISSING, "system"), Status::Ok);
    let v = r.verdict(Area::Gdr).unwrap();
    assert!(
        !v.summary.contains(ids::GDR_DMABUF_UNAVAILABLE),
        "{}",
        v.summary
    );
}

/// Derived: the Sandy Bridge dump with a container sign added (`/.dockerenv`, as Docker creates
/// it, and a docker line in /proc/1/cgroup).
#[test]
fn container_signs() {
    let (_t, top) = unpack_sysfs(SANDY);
    write(&top, ".dockerenv", "");
    write(&top, "proc/1/cgroup", "0::/docker/3f2a\n");
    let r = doctor_on(&top, |_| {});
    let c = find(&r, ids::SYSTEM_CONTAINER, "system");
    assert_eq!(c.status, Status::Unknown);
    assert!(
        c.evidence.contains("/.dockerenv exists") && c.evidence.contains("docker/3f2a"),
        "{}",
        c.evidence
    );
}

/// Derived: IOMMU units and groups added to the Sandy Bridge dump with two GPUs (see
/// `sandy_with_gpus`), the GPUs' groups typed `DMA` (translated), the way an Intel VT-d
/// machine booted with `intel_iommu=on` and no `iommu=pt` shows them.
#[test]
fn iommu_translated() {
    let (_t, top) = unpack_sysfs(SANDY);
    sandy_with_gpus(&top, true);
    mkdir(&top, "sys/class/iommu/dmar0");
    write(&top, "sys/kernel/iommu_groups/7/type", "DMA\n");
    write(&top, "sys/kernel/iommu_groups/9/type", "DMA-FQ\n");
    for (dev, g) in [
        ("0000:00:1c.0/0000:04:00.0/0000:05:00.0", 7),
        ("0000:80:03.0/0000:83:00.0", 9),
    ] {
        let host = if dev.starts_with("0000:80") {
            "pci0000:80"
        } else {
            "pci0000:00"
        };
        symlink(
            &top,
            &format!("sys/devices/{host}/{dev}/iommu_group"),
            &format!("../../../../kernel/iommu_groups/{g}"),
        );
    }
    write(&top, "proc/cmdline", "ro quiet intel_iommu=on\n");
    // Sysfs does not describe NVLink: over NVLink the IOMMU would not be on the path.
    let r = doctor_on(&top, |_| {});
    let p = find(&r, ids::P2P_IOMMU_TRANSLATED, "GPU0-GPU1");
    assert_eq!(p.status, Status::Unknown, "{}", p.evidence);
    assert!(
        p.evidence.contains("DMA") && p.evidence.contains("NVLink is not in the source"),
        "{}",
        p.evidence
    );
    // With driver facts that list no NVLink, the translated PCIe path is the P2P path.
    let r = doctor_on_machine(&top, no_nvlink, |_| {});
    let s = find(&r, ids::SYSTEM_IOMMU, "system");
    assert_eq!(s.status, Status::Degraded);
    assert!(
        s.evidence.contains("dmar0") && s.evidence.contains("intel_iommu=on"),
        "{}",
        s.evidence
    );
    let p = find(&r, ids::P2P_IOMMU_TRANSLATED, "GPU0-GPU1");
    assert_eq!(p.status, Status::Degraded, "{}", p.evidence);
    assert!(p.evidence.contains("DMA-FQ"), "{}", p.evidence);

    // Same, with identity (pass-through) groups: fine.
    write(&top, "sys/kernel/iommu_groups/7/type", "identity\n");
    write(&top, "sys/kernel/iommu_groups/9/type", "identity\n");
    let r = doctor_on_machine(&top, no_nvlink, |_| {});
    assert_eq!(status(&r, ids::SYSTEM_IOMMU, "system"), Status::Ok);
    assert_eq!(
        status(&r, ids::P2P_IOMMU_TRANSLATED, "GPU0-GPU1"),
        Status::Ok
    );
}

/// Derived: two GPUs in the Sandy Bridge dump (see `sandy_with_gpus`): one per socket. The dump
/// has no driver facts, so NVLink is unknown and the SYS path decides nothing; with driver facts
/// that list no NVLink (derived) it is the P2P path.
#[test]
fn gpus_on_two_sockets() {
    let (_t, top) = unpack_sysfs(SANDY);
    sandy_with_gpus(&top, true);
    let r = doctor_on(&top, |_| {});
    for id in [ids::P2P_CROSS_SOCKET, ids::P2P_NCCL_LEVEL] {
        let x = find(&r, id, "GPU0-GPU1");
        assert_eq!(x.status, Status::Unknown, "{}", x.evidence);
        assert!(
            x.evidence.contains("SYS")
                && x.evidence.contains("NVLink is not in the source")
                && x.evidence.contains("sysfs does not describe NVLink"),
            "{}",
            x.evidence
        );
    }
    let r = doctor_on_machine(&top, no_nvlink, |_| {});
    let x = find(&r, ids::P2P_CROSS_SOCKET, "GPU0-GPU1");
    assert_eq!(x.status, Status::Degraded);
    assert!(x.evidence.starts_with("SYS"), "{}", x.evidence);
    // NCCL on Intel: P2P level PXB by default, SYS > PXB.
    let n = find(&r, ids::P2P_NCCL_LEVEL, "GPU0-GPU1");
    assert_eq!(n.status, Status::Degraded);
    assert!(
        n.evidence.contains("SYS") && n.evidence.contains("PXB (NCCL's default)"),
        "{}",
        n.evidence
    );
    // The bridges' config files are the 64-byte header: ACS unknown.
    let a = find(&r, ids::P2P_ACS_ENABLED, "GPU0-GPU1");
    assert_eq!(a.status, Status::Unknown);
    assert!(a.evidence.contains("0000:00:1c.0"), "{}", a.evidence);
    // NCCL_P2P_LEVEL=SYS lets NCCL use P2P there.
    let r = doctor_on_machine(&top, no_nvlink, |i| {
        i.env.insert("NCCL_P2P_LEVEL".into(), "SYS".into());
    });
    let n = find(&r, ids::P2P_NCCL_LEVEL, "GPU0-GPU1");
    assert_eq!(n.status, Status::Ok, "{}", n.evidence);
    assert!(n.evidence.contains("NCCL_P2P_LEVEL=SYS"));
    // NCCL_P2P_DISABLE=1 is not undone by NVLink: degraded even where NVLink is unknown.
    let r = doctor_on(&top, |i| {
        i.env.insert("NCCL_P2P_DISABLE".into(), "1".into());
    });
    let n = find(&r, ids::P2P_NCCL_LEVEL, "GPU0-GPU1");
    assert_eq!(n.status, Status::Degraded, "{}", n.evidence);
    assert_eq!(status(&r, ids::P2P_DISABLED, "GPU0-GPU1"), Status::Degraded);
}

/// Derived: ACS Request and Completion Redirect enabled on the root port 0000:80:02.2 above the
/// ConnectX-3 (its `config` replaced by a 4 KiB space: the original 64-byte header, then an ACS
/// extended capability at 0x100 with control RR|CR), and the Xeon Phi beside it made a GPU.
#[test]
fn acs_redirect_between_gpu_and_nic() {
    let (_t, top) = unpack_sysfs(SANDY);
    sandy_with_gpus(&top, false);
    let cfg = "sys/devices/pci0000:80/0000:80:02.2/config";
    let header = std::fs::read(top.join(cfg)).unwrap();
    assert_eq!(header.len(), 64, "the dump has only the header");
    write(&top, cfg, config_with_acs(&header, 0x4 | 0x8));
    let r = doctor_on(&top, |_| {});
    let f = find(&r, ids::P2P_ACS_ENABLED, "GPU0-NIC2 (mlx4_0)");
    assert_eq!(f.path, Area::Gdr);
    assert_eq!(f.status, Status::Degraded);
    assert!(
        f.evidence.contains("0000:80:02.2 ACS control RR CR"),
        "{}",
        f.evidence
    );

    // Control 0 (capability present, nothing enabled): no redirect; the other root port stays
    // unknown (64-byte header).
    write(&top, cfg, config_with_acs(&header, 0));
    let r = doctor_on(&top, |_| {});
    let f = find(&r, ids::P2P_ACS_ENABLED, "GPU0-NIC2 (mlx4_0)");
    assert_eq!(f.status, Status::Unknown);
    assert!(
        f.evidence.contains("no redirect on 0000:80:02.2"),
        "{}",
        f.evidence
    );
}

/// Derived: the Xeon Phi made a GPU (see `sandy_with_gpus`): its nearest RDMA NIC is the
/// ConnectX-3 on the other root port of the same host bridge: PHB.
#[test]
fn gpu_and_nic_meet_at_the_cpu() {
    let (_t, top) = unpack_sysfs(SANDY);
    sandy_with_gpus(&top, false);
    let r = doctor_on(&top, |_| {});
    let f = find(&r, ids::GDR_NIC_FAR, "GPU0-NIC2 (mlx4_0)");
    assert_eq!(f.status, Status::Degraded);
    assert!(f.evidence.contains("PHB > GDR level PXB"), "{}", f.evidence);
    assert!(f.remedy.contains("NCCL_NET_GDR_LEVEL=PHB"), "{}", f.remedy);
    let r = doctor_on(&top, |i| {
        i.env.insert("NCCL_NET_GDR_LEVEL".into(), "PHB".into());
    });
    assert_eq!(
        status(&r, ids::GDR_NIC_FAR, "GPU0-NIC2 (mlx4_0)"),
        Status::Ok
    );
    // No link files in this dump.
    assert_eq!(
        status(&r, ids::GDR_LINK_DEGRADED, "NIC2 (mlx4_0)"),
        Status::Unknown
    );
}

/// Derived: the ConnectX-3 (a PCIe Gen3 x8 part) given link files saying it trained at
/// 2.5 GT/s x8 of 8 GT/s x8.
#[test]
fn nic_link_trained_low() {
    let (_t, top) = unpack_sysfs(SANDY);
    let d = "sys/devices/pci0000:80/0000:80:02.2/0000:82:00.0";
    write(&top, &format!("{d}/current_link_speed"), "2.5 GT/s\n");
    write(&top, &format!("{d}/max_link_speed"), "8 GT/s\n");
    write(&top, &format!("{d}/current_link_width"), "8\n");
    write(&top, &format!("{d}/max_link_width"), "8\n");
    let r = doctor_on(&top, |_| {});
    let f = find(&r, ids::GDR_LINK_DEGRADED, "NIC2 (mlx4_0)");
    assert_eq!(f.status, Status::Degraded);
    assert!(f.evidence.contains("Gen1 x8 of Gen3 x8"), "{}", f.evidence);
    assert!(f.evidence.contains("2.00 of 7.88 GB/s"), "{}", f.evidence);
}

/// Derived: `nvidia_peermem` present in /sys/module of the Sandy Bridge dump (which has an RDMA
/// NIC), first without `/sys/kernel/mm/memory_peers` (an inbox ib_core without peer-memory
/// support), then with the `nv_mem` entry a MOFED ib_core shows.
#[test]
fn peermem_loaded_with_and_without_memory_peers() {
    let (_t, top) = unpack_sysfs(SANDY);
    mkdir(&top, "sys/module/nvidia_peermem");
    let r = doctor_on(&top, |_| {});
    assert_eq!(status(&r, ids::GDR_PEERMEM_MISSING, "system"), Status::Ok);
    let f = find(&r, ids::GDR_PEERMEM_UNREGISTERED, "system");
    assert_eq!(f.status, Status::Unavailable);
    assert!(
        f.evidence.contains("memory_peers is absent"),
        "{}",
        f.evidence
    );
    write(&top, "sys/kernel/mm/memory_peers/nv_mem/version", "1.3\n");
    let r = doctor_on(&top, |_| {});
    let f = find(&r, ids::GDR_PEERMEM_UNREGISTERED, "system");
    assert_eq!(f.status, Status::Ok, "{}", f.evidence);
    assert!(f.evidence.contains("nv_mem"));
}

/// Derived: nvidia-fs loaded (its /proc version file added) on the Sandy Bridge dump.
#[test]
fn nvidia_fs_version() {
    let (_t, top) = unpack_sysfs(SANDY);
    let r = doctor_on(&top, |_| {});
    // The dump has no /proc/modules and no /sys/module: unknown, not missing.
    assert_eq!(
        status(&r, ids::GDS_NVIDIA_FS_MISSING, "system"),
        Status::Unknown
    );
    write(&top, "proc/driver/nvidia-fs/version", "version: 2.26.6\n");
    let r = doctor_on(&top, |_| {});
    let f = find(&r, ids::GDS_NVIDIA_FS_MISSING, "system");
    assert_eq!(f.status, Status::Ok);
    assert!(f.evidence.contains("2.26.6"));
}

fn probe(dev: (u32, u32), magic: u64) -> PathInput {
    PathInput {
        path: PathBuf::from("/data"),
        probe: Gathered::Got(PathProbe {
            fs_magic: Some(magic),
            dev: Some(dev),
            odirect: OdirectProbe::Works,
        }),
    }
}

/// The Sandy Bridge dump's own block devices, each given as the device of a `--path` (the
/// probe's facts are what `stat` and `statfs` would say for an ext4 file system there):
/// `nvme0n1p1` (259:1 in /sys/class/block) and `sda` (8:0). And derived: a device-mapper
/// volume dm-0 (253:0, `dm/name` vg0-data) over nvme0n1p1 added to the dump.
#[test]
fn block_devices_behind_a_path() {
    let (_t, top) = unpack_sysfs(SANDY);
    sandy_with_gpus(&top, false);
    write(&top, "proc/driver/nvidia-fs/version", "version: 2.26.6\n");
    let run = |dev| {
        doctor_on(&top, |i| {
            i.paths = vec![probe(dev, 0xEF53)];
        })
    };
    let r = run((259, 1));
    assert_eq!(status(&r, ids::GDS_DEVICE_MAPPER, "/data"), Status::Ok);
    let f = find(&r, ids::GDS_NOT_NVME, "/data");
    assert_eq!(f.status, Status::Ok);
    assert!(f.evidence.contains("nvme0n1p1"), "{}", f.evidence);
    // NVMe on socket 0, the GPU (former Xeon Phi) on socket 1.
    let f = find(&r, ids::GDS_NVME_FAR, "/data: GPU0-NVME0");
    assert_eq!(f.status, Status::Degraded);
    assert!(f.evidence.contains("at SYS"), "{}", f.evidence);
    // cuFile facts are not in a replay: native vs compat cannot be told.
    assert_eq!(
        status(&r, ids::GDS_HANDLE_REGISTER_FAILED, "/data"),
        Status::NotRun
    );

    let r = run((8, 0));
    let f = find(&r, ids::GDS_NOT_NVME, "/data");
    assert_eq!(f.status, Status::Degraded);
    assert!(f.evidence.contains("sda"), "{}", f.evidence);
    assert_eq!(status(&r, ids::GDS_COMPAT_MODE, "/data"), Status::Degraded);

    symlink(
        &top,
        "sys/class/block/dm-0",
        "../../devices/virtual/block/dm-0",
    );
    write(&top, "sys/devices/virtual/block/dm-0/dev", "253:0\n");
    write(&top, "sys/devices/virtual/block/dm-0/dm/name", "vg0-data\n");
    symlink(
        &top,
        "sys/devices/virtual/block/dm-0/slaves/nvme0n1p1",
        "../../../../pci0000:00/0000:00:02.0/block/nvme0n1/nvme0n1p1",
    );
    let r = run((253, 0));
    let f = find(&r, ids::GDS_DEVICE_MAPPER, "/data");
    assert_eq!(f.status, Status::Degraded);
    assert!(
        f.evidence.contains("vg0-data") && f.evidence.contains("nvme0n1p1"),
        "{}",
        f.evidence
    );
    let c = find(&r, ids::GDS_COMPAT_MODE, "/data");
    assert_eq!(c.status, Status::Degraded);
    assert!(
        c.evidence.contains(ids::GDS_DEVICE_MAPPER),
        "{}",
        c.evidence
    );
}

/// Derived: a cufile.json in the Sandy Bridge dump's /etc, with comments as NVIDIA ships it,
/// that forbids compatibility mode; nvidia-fs is not loaded there (/proc/modules added without
/// it), so cuFile can run neither way on an ext4 NVMe path.
#[test]
fn cufile_json_forbids_compat() {
    let (_t, top) = unpack_sysfs(SANDY);
    write(
        &top,
        "proc/modules",
        "mlx4_ib 167936 0 - Live 0x0000000000000000\n",
    );
    write(
        &top,
        "etc/cufile.json",
        "{\n  // GDS settings\n  \"properties\": {\n    /* no fallback */\n    \"allow_compat_mode\": false,\n    \"max_direct_io_size_kb\": 16384,\n  }\n}\n",
    );
    let r = doctor_on(&top, |i| i.paths = vec![probe((259, 1), 0xEF53)]);
    let c = find(&r, ids::GDS_CUFILE_CONFIG, "system");
    assert_eq!(c.status, Status::Ok);
    assert!(
        c.evidence.contains("allow_compat_mode false") && c.evidence.contains("16384"),
        "{}",
        c.evidence
    );
    assert_eq!(
        status(&r, ids::GDS_NVIDIA_FS_MISSING, "system"),
        Status::Degraded
    );
    let m = find(&r, ids::GDS_COMPAT_MODE, "/data");
    assert_eq!(m.status, Status::Unavailable, "{}", m.evidence);

    // A broken file is reported with its line.
    write(
        &top,
        "etc/cufile.json",
        "{\n  \"properties\": {\n    \"allow_compat_mode\": false\n    \"max_direct_io_size_kb\": 1\n  }\n}\n",
    );
    let r = doctor_on(&top, |_| {});
    let c = find(&r, ids::GDS_CUFILE_CONFIG, "system");
    assert_eq!(c.status, Status::Unknown);
    assert!(c.evidence.contains("line 4, column 5"), "{}", c.evidence);

    // CUFILE_ENV_PATH_JSON names another file.
    write(
        &top,
        "opt/app/cufile.json",
        "{ \"properties\": { \"use_pci_p2pdma\": true } }",
    );
    let r = doctor_on(&top, |i| {
        i.env
            .insert("CUFILE_ENV_PATH_JSON".into(), "/opt/app/cufile.json".into());
    });
    let c = find(&r, ids::GDS_CUFILE_CONFIG, "system");
    assert!(
        c.evidence
            .contains("/opt/app/cufile.json (CUFILE_ENV_PATH_JSON)")
            && c.evidence.contains("use_pci_p2pdma true"),
        "{}",
        c.evidence
    );
}

/// The Sandy Bridge dump's /proc/meminfo (MemTotal 31.3 GiB) against memlock limits given as
/// the live gathering would.
#[test]
fn memlock_against_memtotal() {
    let (_t, top) = unpack_sysfs(SANDY);
    let r = doctor_on(&top, |i| {
        i.memlock = Gathered::Got(Memlock {
            soft: Some(8 << 20),
            hard: Some(8 << 20),
        })
    });
    let f = find(&r, ids::SYSTEM_MEMLOCK_LOW, "system");
    assert_eq!(f.status, Status::Degraded);
    assert!(
        f.evidence.contains("soft 8 MiB") && f.evidence.contains("MemTotal 31.3 GiB"),
        "{}",
        f.evidence
    );
    let r = doctor_on(&top, |i| {
        i.memlock = Gathered::Got(Memlock {
            soft: None,
            hard: None,
        })
    });
    assert_eq!(status(&r, ids::SYSTEM_MEMLOCK_LOW, "system"), Status::Ok);
}

/// The findings of `r` with id `id`, in report order.
fn findings_with<'a>(r: &'a gdpath_doctor::Report, id: &str) -> Vec<&'a gdpath::Finding> {
    r.findings.iter().filter(|f| f.id.as_str() == id).collect()
}

/// The doctor on an NCCL topology fixture (a replay: file checks are unknown, not failures).
fn doctor_on_nccl_xml(rel: &str) -> gdpath_doctor::Report {
    doctor_on_nccl_file(fixture(rel))
}

fn doctor_on_nccl_file(path: PathBuf) -> gdpath_doctor::Report {
    doctor_on_source(gdpath::topo::Source::NcclXml(path))
}

/// Azure NDv2 (NCCL topology file): one InfiniBand NIC on NUMA 0; GPUs 0–3 reach it at PHB,
/// GPUs 4–7 at SYS (INDEX.md). NCCL's default GDR level PXB turns GDR off for all of them.
#[test]
fn azure_ndv2_nic_distance() {
    let r = doctor_on_nccl_xml("nccl-xml/nccl-azure-ndv2-topo.xml");
    let far = findings_with(&r, ids::GDR_NIC_FAR);
    assert_eq!(far.len(), 8);
    for (i, f) in far.iter().enumerate() {
        assert!(
            f.subject.starts_with(&format!("GPU{i}-NIC0")),
            "{}",
            f.subject
        );
        assert_eq!(f.status, Status::Degraded);
        let class = if i < 4 { "PHB" } else { "SYS" };
        assert!(
            f.evidence.contains(&format!("at {class} > GDR level PXB")),
            "{}",
            f.evidence
        );
    }
    // No files in an XML source: the file checks are unknown, not failures.
    assert_eq!(status(&r, ids::SYSTEM_IOMMU, "system"), Status::Unknown);
    assert_eq!(
        status(&r, ids::GDR_NO_RDMA_DEVICE, "system"),
        Status::Unknown
    );
}

/// AWS p4d (NCCL topology file): four EFA adapters (1d0f:efa0) without `<nic>` entries, so the
/// file names no RDMA device; the doctor recognises them by PCI identity, still reports the
/// driver question as unknown, and measures each GPU against its own switch's EFA (PIX).
#[test]
fn aws_p4d_efa_recognised_by_pci_identity() {
    let r = doctor_on_nccl_xml("nccl-xml/nccl-aws-p4d-24xl-topo.xml");
    let f = r
        .findings
        .iter()
        .find(|f| f.id.as_str() == ids::GDR_NO_RDMA_DEVICE)
        .unwrap();
    assert_eq!(f.status, Status::Unknown);
    assert_eq!(
        f.evidence.matches("(Amazon EFA)").count(),
        4,
        "{}",
        f.evidence
    );
    // Each GPU's nearest RDMA-capable NIC is the EFA under its own switch: not far.
    let far = findings_with(&r, ids::GDR_NIC_FAR);
    assert_eq!(far.len(), 8);
    for f in far {
        assert_eq!(f.status, Status::Ok, "{}: {}", f.subject, f.evidence);
    }
}

/// AWS g5.48xlarge (NCCL topology file with bare `<pci busid>` entries, no class or vendor):
/// its GPUs cannot be recognised, so their absence is unknown, not "no GPU".
#[test]
fn aws_g5_unclassified_entries_are_unknown_not_absent() {
    let r = doctor_on_nccl_xml("nccl-xml/nccl-aws-g5.48xl-topo.xml");
    assert_eq!(status(&r, ids::SYSTEM_NO_GPU, "system"), Status::Unknown);
    assert_eq!(status(&r, ids::P2P_UNSUPPORTED, "system"), Status::Unknown);
    assert_ne!(
        r.exit_code(),
        2,
        "nothing in the file says a path is unavailable"
    );
}

/// NCCL topology files without `<nvlink>` entries (every vendored one but Azure NC A100 v4's)
/// do not describe NVLink: the PCIe-path verdicts that NVLink would undo (ACS, IOMMU, SYS,
/// beyond NCCL's P2P level) are unknown, with the reason, never degraded; a clean PCIe path
/// stays ok. On AWS p4d (A100 SXM4 on NVSwitch) GPU0 and GPU1 share a switch (PIX: ok), GPU0
/// and GPU4 cross sockets (unknown). Derived: the same file with one `<nvlink>` entry (GPU0 →
/// GPU1, NV12) describes NVLink, so its absence between the other pairs is stated and their
/// verdicts are firm again.
#[test]
fn nccl_files_without_nvlink_give_p2p_unknown_not_degraded() {
    for name in [
        "nccl-aws-p4d-24xl-topo.xml",
        "nccl-azure-ndv2-topo.xml",
        "nccl-azure-ndv4-topo.xml",
    ] {
        let r = doctor_on_nccl_xml(&format!("nccl-xml/{name}"));
        assert!(r.coverage.nvlink.is_unknown(), "{name}");
        let p2p: Vec<_> = r.findings.iter().filter(|f| f.path == Area::P2p).collect();
        assert!(p2p.len() >= 28, "{name}: {} P2P findings", p2p.len());
        for f in &p2p {
            assert_ne!(f.status, Status::Degraded, "{name}: {} {}", f.id, f.subject);
            if f.status == Status::Unknown
                && [ids::P2P_CROSS_SOCKET, ids::P2P_NCCL_LEVEL].contains(&f.id.as_str())
            {
                assert!(
                    f.evidence.contains("NVLink is not in the source")
                        && f.evidence.contains("no <nvlink> entries"),
                    "{name}: {}",
                    f.evidence
                );
            }
        }
    }
    let r = doctor_on_nccl_xml("nccl-xml/nccl-aws-p4d-24xl-topo.xml");
    let x = find(&r, ids::P2P_CROSS_SOCKET, "GPU0-GPU4");
    assert_eq!(x.status, Status::Unknown, "{}", x.evidence);
    assert!(x.evidence.starts_with("PCIe path SYS"), "{}", x.evidence);
    assert_eq!(
        status(&r, ids::P2P_NCCL_LEVEL, "GPU0-GPU2"),
        Status::Unknown
    );
    // A clean PCIe path stays ok: GPU0 and GPU1 share a switch (PIX).
    assert_eq!(status(&r, ids::P2P_NCCL_LEVEL, "GPU0-GPU1"), Status::Ok);
    assert_eq!(status(&r, ids::P2P_CROSS_SOCKET, "GPU0-GPU1"), Status::Ok);

    let text = std::fs::read_to_string(fixture("nccl-xml/nccl-aws-p4d-24xl-topo.xml")).unwrap();
    let gpu0 = r#"link_width="16"/> <!-- GPU 0 -->"#;
    assert!(text.contains(gpu0));
    let derived = text.replace(
        gpu0,
        r#"link_width="16"><gpu dev="0" sm="80" rank="0" gdr="1"><nvlink target="0000:10:1d.0" count="12" tclass="0x030200"/></gpu></pci>"#,
    );
    let tmp = scratch();
    let file = tmp.path().join("p4d-one-nvlink.xml");
    std::fs::write(&file, derived).unwrap();
    let r = doctor_on_nccl_file(file);
    assert!(r.coverage.nvlink.is_described());
    assert_eq!(status(&r, ids::P2P_CROSS_SOCKET, "GPU0-GPU1"), Status::Ok);
    assert_eq!(status(&r, ids::P2P_ACS_ENABLED, "GPU0-GPU1"), Status::Ok);
    let x = find(&r, ids::P2P_CROSS_SOCKET, "GPU0-GPU4");
    assert_eq!(x.status, Status::Degraded, "{}", x.evidence);
    assert!(!x.evidence.contains("NVLink"), "{}", x.evidence);
    assert_eq!(
        status(&r, ids::P2P_NCCL_LEVEL, "GPU0-GPU4"),
        Status::Degraded
    );
}

/// Azure NC A100 v4 (NCCL topology dump): its one network device, eth0, is marked `gdr="0"`:
/// NCCL found no NIC that can read or write GPU memory, so GDR is unavailable, said from the
/// file (no RDMA device name, no RDMA-capable PCI identity either).
#[test]
fn azure_ncv4_nic_marked_gdr_0_makes_gdr_unavailable() {
    let r = doctor_on_nccl_xml("nccl-xml/nccl-azure-ncv4-topo.xml");
    let f = find(&r, ids::GDR_NO_RDMA_DEVICE, "system");
    assert_eq!(f.status, Status::Unavailable, "{}", f.evidence);
    assert!(
        f.evidence.contains("gdr=0") && f.evidence.contains("eth0 on NIC0"),
        "{}",
        f.evidence
    );
    assert!(!f.remedy.is_empty());

    // Derived: the same file with eth0 marked gdr="1" (as NCCL writes it where its network
    // plugin can read and write GPU memory through the NIC): the check passes, saying so.
    let text = std::fs::read_to_string(fixture("nccl-xml/nccl-azure-ncv4-topo.xml")).unwrap();
    assert_eq!(text.matches(r#"maxconn="65536" gdr="0""#).count(), 1);
    let tmp = scratch();
    let file = tmp.path().join("ncv4-gdr1.xml");
    std::fs::write(
        &file,
        text.replace(r#"maxconn="65536" gdr="0""#, r#"maxconn="65536" gdr="1""#),
    )
    .unwrap();
    let r = doctor_on_nccl_file(file);
    let f = find(&r, ids::GDR_NO_RDMA_DEVICE, "system");
    assert_eq!(f.status, Status::Ok, "{}", f.evidence);
    assert!(f.evidence.contains("eth0 on NIC0 gdr=1"), "{}", f.evidence);
}

/// hwloc's POWER8 export with an `NVLinkBandwidth` matrix describes NVLink: GPU0–GPU1 and
/// GPU2–GPU3 are NV2 (P2P over NVLink, so ACS and the socket do not apply), and the pairs
/// across sockets have no NVLink, so their SYS path is the P2P path: degraded, not unknown.
#[test]
fn hwloc_nvlink_distances_give_nv_and_verdicts_from_them() {
    let r = doctor_on_source(gdpath::topo::Source::HwlocXml(fixture(
        "hwloc-xml/hwloc-xml-power8gpudistances.xml",
    )));
    assert!(r.coverage.nvlink.is_described());
    for pair in ["GPU0-GPU1", "GPU2-GPU3"] {
        let x = find(&r, ids::P2P_CROSS_SOCKET, pair);
        assert_eq!(x.status, Status::Ok, "{}", x.evidence);
        assert!(x.evidence.starts_with("NV2 "), "{}", x.evidence);
        let a = find(&r, ids::P2P_ACS_ENABLED, pair);
        assert_eq!(a.status, Status::Ok, "{}", a.evidence);
        let n = find(&r, ids::P2P_NCCL_LEVEL, pair);
        assert!(
            n.evidence.starts_with("NCCL path NVL (NV2)"),
            "{}",
            n.evidence
        );
        assert_eq!(n.status, Status::Ok);
    }
    for pair in ["GPU0-GPU2", "GPU0-GPU3", "GPU1-GPU2", "GPU1-GPU3"] {
        for id in [ids::P2P_CROSS_SOCKET, ids::P2P_NCCL_LEVEL] {
            let f = find(&r, id, pair);
            assert_eq!(f.status, Status::Degraded, "{pair} {id}: {}", f.evidence);
            assert!(!f.evidence.contains("NVLink is not"), "{}", f.evidence);
        }
    }
}

/// The same export without its `NVLinkBandwidth` matrix (derived: the distances element
/// removed) no longer describes NVLink: the pairs across sockets are unknown, not degraded.
#[test]
fn hwloc_export_without_nvlink_distances_leaves_p2p_unknown() {
    let text =
        std::fs::read_to_string(fixture("hwloc-xml/hwloc-xml-power8gpudistances.xml")).unwrap();
    let name = text.find("NVLinkBandwidth").expect("the NVLink matrix");
    let open = text[..name].rfind("<distances2hetero").unwrap();
    let end = "</distances2hetero>";
    let close = text[open..].find(end).unwrap() + open + end.len();
    let derived = format!("{}{}", &text[..open], &text[close..]);
    let tmp = scratch();
    let file = tmp.path().join("power8-no-nvlink.xml");
    std::fs::write(&file, derived).unwrap();
    let r = doctor_on_source(gdpath::topo::Source::HwlocXml(file));
    assert!(r.coverage.nvlink.is_unknown());
    let f = find(&r, ids::P2P_CROSS_SOCKET, "GPU0-GPU2");
    assert_eq!(f.status, Status::Unknown, "{}", f.evidence);
    assert!(f.evidence.contains("NVLinkBandwidth"), "{}", f.evidence);
    assert!(r
        .findings
        .iter()
        .all(|f| f.path != Area::P2p || f.status != Status::Degraded));
}
