//! The doctor on the H200 machine as its probe shows it (fixtures/device/h200x2-probe-*.txt):
//! a sysfs tree and driver facts built from the probe's own lines (see `doctor_common`), and
//! variants with one fact changed, each described in its test.

mod doctor_common;
use doctor_common::*;
use gdpath::finding::ids;
use gdpath::topo::facts::P2pCap;
use gdpath::{Area, Status};
use gdpath_doctor::{
    CufileFacts, Gathered, OdirectProbe, PathInput, PathProbe, RdmaCoreFacts, UcxFacts,
};
use std::path::PathBuf;

const PAIR: &str = "GPU0-GPU1";

#[test]
fn h200_as_probed() {
    let r = doctor_h200(h200_facts(), |_| {});
    // P2P over NVLink available.
    for id in [
        ids::P2P_UNSUPPORTED,
        ids::P2P_GPU_NOT_SUPPORTED,
        ids::P2P_NVLINK_NO_P2P,
        ids::P2P_ACS_ENABLED,
        ids::P2P_IOMMU_TRANSLATED,
        ids::P2P_CROSS_SOCKET,
        ids::P2P_DISABLED,
        ids::P2P_NCCL_LEVEL,
    ] {
        assert_eq!(
            status(&r, id, PAIR),
            Status::Ok,
            "{id}: {}",
            find(&r, id, PAIR).evidence
        );
    }
    let u = find(&r, ids::P2P_UNSUPPORTED, PAIR);
    assert!(
        u.evidence.starts_with("NV18") && u.evidence.contains("pci NS"),
        "{}",
        u.evidence
    );
    for g in ["GPU0", "GPU1"] {
        let f = find(&r, ids::P2P_NVLINK_DEGRADED, g);
        assert_eq!(f.status, Status::Ok);
        assert!(f.evidence.contains("18 of 18"), "{}", f.evidence);
        assert_eq!(status(&r, ids::GDR_BAR1_SMALL, g), Status::Ok);
        let l = find(&r, ids::GDR_LINK_DEGRADED, g);
        assert_eq!(l.status, Status::Ok);
        assert!(
            l.evidence.contains("Gen5 x16 of Gen5 x16"),
            "{}",
            l.evidence
        );
    }
    let v = r.verdict(Area::P2p).unwrap();
    assert_eq!(v.status, Status::Ok, "{}", v.summary);
    // GDR unavailable: no RDMA device (/sys/class/infiniband empty).
    let g = find(&r, ids::GDR_NO_RDMA_DEVICE, "system");
    assert_eq!(g.status, Status::Unavailable);
    assert!(g.evidence.contains("/sys/class/infiniband is empty"));
    assert_eq!(r.verdict(Area::Gdr).unwrap().status, Status::Unavailable);
    // No nvidia-fs (the probe's module grep and /proc/driver/nvidia-fs).
    assert_eq!(
        status(&r, ids::GDS_NVIDIA_FS_MISSING, "system"),
        Status::Degraded
    );
    // System: driver and CUDA from the facts, kernel from uname, IOMMU off.
    assert!(find(&r, ids::SYSTEM_DRIVER, "system")
        .evidence
        .contains("580.159.04"));
    assert!(find(&r, ids::SYSTEM_CUDA_MISSING, "system")
        .evidence
        .contains("CUDA driver API 13.0"));
    assert!(find(&r, ids::SYSTEM_KERNEL, "system")
        .evidence
        .contains("6.18.44-fc-v657-gpu"));
    assert_eq!(status(&r, ids::SYSTEM_IOMMU, "system"), Status::Ok);
    assert_eq!(r.exit_code(), 2);
}

/// The H200 with cuFile's answer recorded in docs/machines.md for that machine:
/// libcufile 1.15.1 loads and the driver opens, but `cuFileHandleRegister` fails with "file
/// descriptor is not registered" on ext4 (the root disk, virtio `vda`) and tmpfs (/dev/shm);
/// plus UCX 1.16 without CUDA transports and rdma-core with `ibv_reg_dmabuf_mr` (libibverbs
/// 1.14.50 = rdma-core 50 in the probe).
#[test]
fn h200_gds_unavailable_with_cufiles_reason() {
    let err = "file descriptor is not registered";
    let r = doctor_h200(h200_facts(), |i| {
        let mut reg = std::collections::BTreeMap::new();
        reg.insert(PathBuf::from("/"), Some(err.to_owned()));
        reg.insert(PathBuf::from("/dev/shm"), Some(err.to_owned()));
        i.cufile = Gathered::Got(CufileFacts {
            library_found: true,
            version: Some("1.15.1".into()),
            handle_register: reg,
            ..Default::default()
        });
        i.ucx = Gathered::Got(UcxFacts {
            version: Some("1.16.0".into()),
            transports: ["self", "tcp", "sysv", "posix", "cma"]
                .map(String::from)
                .to_vec(),
            cuda_support: None,
        });
        i.rdma_core = Gathered::Got(RdmaCoreFacts {
            library: Some("libibverbs.so.1".into()),
            has_reg_dmabuf_mr: true,
        });
        i.paths = vec![
            PathInput {
                path: PathBuf::from("/"),
                probe: Gathered::Got(PathProbe {
                    fs_magic: Some(0xEF53),
                    dev: None,
                    odirect: OdirectProbe::Works,
                }),
            },
            PathInput {
                path: PathBuf::from("/dev/shm"),
                probe: Gathered::Got(PathProbe {
                    fs_magic: Some(0x0102_1994),
                    dev: Some((0, 27)),
                    odirect: OdirectProbe::Works,
                }),
            },
        ];
    });
    for p in ["/", "/dev/shm"] {
        let h = find(&r, ids::GDS_HANDLE_REGISTER_FAILED, p);
        assert_eq!(h.status, Status::Unavailable);
        assert!(h.evidence.contains(err), "{}", h.evidence);
        let c = find(&r, ids::GDS_COMPAT_MODE, p);
        assert_eq!(c.status, Status::Unavailable);
        assert!(c.evidence.contains(err));
        assert_eq!(status(&r, ids::STORAGE_ODIRECT_UNSUPPORTED, p), Status::Ok);
    }
    assert_eq!(
        status(&r, ids::GDS_FS_UNSUPPORTED, "/dev/shm"),
        Status::Degraded
    );
    assert_eq!(status(&r, ids::GDS_FS_UNSUPPORTED, "/"), Status::Ok);
    assert_eq!(status(&r, ids::GDS_CUFILE_MISSING, "system"), Status::Ok);
    assert_eq!(r.verdict(Area::Gds).unwrap().status, Status::Unavailable);
    let u = find(&r, ids::GDR_UCX_NO_CUDA, "system");
    assert_eq!(u.status, Status::Degraded);
    assert!(u.evidence.contains("UCX 1.16.0"));
    // Kernel 6.18 and rdma-core 50 are fine for dma-buf; the CUDA attribute is not in the probe.
    let d = find(&r, ids::GDR_DMABUF_UNAVAILABLE, "system");
    assert_eq!(d.status, Status::Unknown, "{}", d.evidence);
    assert!(
        d.evidence.contains("6.18.44-fc-v657-gpu ≥ 5.12")
            && d.evidence.contains("exports ibv_reg_dmabuf_mr")
    );
}

/// Variant: the CUDA attributes filled as a driver would (GDR 1, dma-buf 1 — and then 0).
#[test]
fn cuda_attributes() {
    let mut f = h200_facts();
    for g in &mut f.gpus {
        g.gdr_supported = Some(true);
        g.dma_buf_supported = Some(true);
    }
    let r = doctor_h200(f.clone(), |i| {
        i.rdma_core = Gathered::Got(RdmaCoreFacts {
            library: Some("libibverbs.so.1".into()),
            has_reg_dmabuf_mr: true,
        })
    });
    assert_eq!(status(&r, ids::GDR_CUDA_UNSUPPORTED, "GPU0"), Status::Ok);
    assert_eq!(
        status(&r, ids::GDR_DMABUF_UNAVAILABLE, "system"),
        Status::Ok
    );
    // No peer-memory module, but dma-buf works: the peer-memory check passes.
    let p = find(&r, ids::GDR_PEERMEM_MISSING, "system");
    assert_eq!(p.status, Status::Ok, "{}", p.evidence);
    assert!(
        p.evidence.contains("/sys/module/nvidia_peermem absent") && p.evidence.contains("dma-buf")
    );

    for g in &mut f.gpus {
        g.gdr_supported = Some(false);
        g.dma_buf_supported = Some(false);
    }
    let r = doctor_h200(f, |i| i.rdma_core = Gathered::Got(RdmaCoreFacts::default()));
    assert_eq!(
        status(&r, ids::GDR_CUDA_UNSUPPORTED, "GPU1"),
        Status::Unavailable
    );
    let d = find(&r, ids::GDR_DMABUF_UNAVAILABLE, "system");
    assert_eq!(d.status, Status::Unavailable);
    assert!(
        d.evidence
            .contains("GPU0 CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED 0")
            && d.evidence.contains("libibverbs not found")
    );
    assert_eq!(
        status(&r, ids::GDR_PEERMEM_MISSING, "system"),
        Status::Unavailable
    );
}

/// Variant: BAR1 of 256 MiB (what a GPU shows without Resizable BAR) instead of 256 GiB.
#[test]
fn small_bar1() {
    let mut f = h200_facts();
    f.gpus[0].bar1_total_bytes = Some(256 << 20);
    let r = doctor_h200(f, |_| {});
    let b = find(&r, ids::GDR_BAR1_SMALL, "GPU0");
    assert_eq!(b.status, Status::Degraded);
    assert!(
        b.evidence.contains("BAR1 256 MiB") && b.evidence.contains("140.4 GiB"),
        "{}",
        b.evidence
    );
    assert_eq!(status(&r, ids::GDR_BAR1_SMALL, "GPU1"), Status::Ok);
}

/// Variant: two of the 18 NVLinks between the GPUs down (NVML lists 16 up on each end): NV16.
#[test]
fn nvlinks_down() {
    let mut f = h200_facts();
    for g in &mut f.gpus {
        g.nvlinks.truncate(16);
    }
    let r = doctor_h200(f, |_| {});
    for g in ["GPU0", "GPU1"] {
        let n = find(&r, ids::P2P_NVLINK_DEGRADED, g);
        assert_eq!(n.status, Status::Degraded);
        assert!(n.evidence.contains("16 of 18"), "{}", n.evidence);
    }
    assert!(find(&r, ids::P2P_UNSUPPORTED, PAIR)
        .evidence
        .starts_with("NV16"));
    // Links still up: UCX keeps cuda_ipc's gets, so the remedy does not warn of them.
    assert!(!find(&r, ids::P2P_NVLINK_DEGRADED, "GPU0")
        .remedy
        .contains("gets"));
}

/// Variant: no NVLink up at all (as NVML shows the GPU of a one-GPU H200 VM): degraded, and the
/// remedy says what else that costs: UCX emulates GPU → GPU gets between processes.
#[test]
fn no_nvlink_up() {
    let mut f = h200_facts();
    for g in &mut f.gpus {
        g.nvlinks.clear();
    }
    let r = doctor_h200(f, |_| {});
    for g in ["GPU0", "GPU1"] {
        let n = find(&r, ids::P2P_NVLINK_DEGRADED, g);
        assert_eq!(n.status, Status::Degraded);
        assert!(n.evidence.contains("0 of 18"), "{}", n.evidence);
        assert!(
            n.remedy.contains("emulates them in software")
                && n.remedy.contains("UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y"),
            "{}",
            n.remedy
        );
    }
}

/// Variant: NVML P2P read and write "NS" while the 18 NVLinks are up (what a GPU in a bad state
/// or a stopped fabric manager shows).
#[test]
fn nvlink_without_p2p() {
    let mut f = h200_facts();
    for p in &mut f.pairs {
        let n = p.nvml.as_mut().unwrap();
        n.read = P2pCap::Ns;
        n.write = P2pCap::Ns;
        p.cuda.as_mut().unwrap().access_supported = false;
    }
    let r = doctor_h200(f, |_| {});
    assert_eq!(
        status(&r, ids::P2P_NVLINK_NO_P2P, PAIR),
        Status::Unavailable
    );
    assert_eq!(status(&r, ids::P2P_UNSUPPORTED, PAIR), Status::Unavailable);
    // NCCL refuses P2P when NVML's read/write status is not OK.
    let n = find(&r, ids::P2P_NCCL_LEVEL, PAIR);
    assert_eq!(n.status, Status::Degraded);
    assert!(n.evidence.contains("NVML"), "{}", n.evidence);
    assert_eq!(r.verdict(Area::P2p).unwrap().status, Status::Unavailable);
}

/// Variant: every capability "GNS", as `nvidia-smi topo -p2p` prints for the two RTX 5090 of
/// fixtures/nvidia-smi/topo-club3090-1229-2x5090-phb-gns.txt, on the H200 facts.
#[test]
fn gpu_not_supported() {
    let fixture =
        std::fs::read_to_string(fixture("nvidia-smi/topo-club3090-1229-2x5090-phb-gns.txt"))
            .unwrap();
    assert!(fixture.contains("GNS"), "the fixture shows GNS");
    let mut f = h200_facts();
    for p in &mut f.pairs {
        let n = p.nvml.as_mut().unwrap();
        n.read = P2pCap::Gns;
        n.write = P2pCap::Gns;
        n.nvlink = P2pCap::Gns;
        n.atomics = P2pCap::Gns;
        n.pci = P2pCap::Gns;
    }
    let r = doctor_h200(f, |_| {});
    let g = find(&r, ids::P2P_GPU_NOT_SUPPORTED, PAIR);
    assert_eq!(g.status, Status::Unavailable);
    assert!(g.evidence.contains("read GNS"), "{}", g.evidence);
}

/// The environment variables that change what NCCL and CUDA do with the pair.
#[test]
fn environment_disables_p2p() {
    let r = doctor_h200(h200_facts(), |i| {
        i.env.insert("NCCL_P2P_DISABLE".into(), "1".into());
    });
    let d = find(&r, ids::P2P_DISABLED, PAIR);
    assert_eq!(d.status, Status::Degraded);
    assert!(d.evidence.contains("NCCL_P2P_DISABLE=1"));
    let n = find(&r, ids::P2P_NCCL_LEVEL, PAIR);
    assert_eq!(n.status, Status::Degraded);
    assert!(n.evidence.contains("LOC"), "{}", n.evidence);
    assert_eq!(r.exit_code(), 2, "GDR is still unavailable");

    let r = doctor_h200(h200_facts(), |i| {
        i.env.insert("CUDA_VISIBLE_DEVICES".into(), "0".into());
    });
    let d = find(&r, ids::P2P_DISABLED, PAIR);
    assert_eq!(d.status, Status::Degraded);
    assert!(d.evidence.contains("hides GPU1"), "{}", d.evidence);
    let r = doctor_h200(h200_facts(), |i| {
        i.env.insert("CUDA_VISIBLE_DEVICES".into(), "1,0".into());
    });
    assert_eq!(status(&r, ids::P2P_DISABLED, PAIR), Status::Ok);
}

/// Without driver facts (no NVML here), live: the P2P pair checks that need them are unknown,
/// and the PCIe view still says the GPUs sit directly on the root bus.
#[test]
fn h200_tree_without_driver_facts() {
    let tmp = h200_tree();
    let r = doctor_on(tmp.path(), |i| {
        i.mode = gdpath_doctor::Mode::Live;
        i.driver = Gathered::Failed("libnvidia-ml.so.1: cannot open shared object file".into());
    });
    assert_eq!(status(&r, ids::P2P_UNSUPPORTED, PAIR), Status::Unknown);
    let c = find(&r, ids::SYSTEM_CUDA_MISSING, "system");
    assert_eq!(c.status, Status::Unavailable);
    assert!(c.evidence.contains("libnvidia-ml.so.1"));
    let a = find(&r, ids::P2P_ACS_ENABLED, PAIR);
    assert_eq!(a.status, Status::Ok);
    assert!(a.evidence.contains("root bus pci0000:00"), "{}", a.evidence);
    // PHB, so NCCL (default PXB) would not use P2P over PCIe; but without driver facts NVLink
    // is not described (NV18 on this machine): unknown, not degraded.
    let n = find(&r, ids::P2P_NCCL_LEVEL, PAIR);
    assert_eq!(n.status, Status::Unknown, "{}", n.evidence);
    assert!(
        n.evidence.contains("PHB") && n.evidence.contains("NVLink is not in the source"),
        "{}",
        n.evidence
    );
    // A live GPU machine without /proc/driver/nvidia/version: the driver is not loaded.
    assert_eq!(
        status(&r, ids::SYSTEM_DRIVER, "system"),
        Status::Unavailable
    );
}
