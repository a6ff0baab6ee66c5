//! Every hwloc sysfs dump in fixtures/hwloc-sysfs: what fixtures/README.md says a reader must
//! find, read through `--sysfs-root`, and replayed from a snapshot with identical JSON (but for
//! the replay naming itself).

mod common;
use common::*;
use gdpath_topo::snapshot::{self, Snapshot};
use gdpath_topo::{load, DeviceKind, DirView, LinkClass, Machine, Recording, Source};

fn read(name: &str) -> (tempfile::TempDir, std::path::PathBuf, Machine) {
    let (tmp, top) = unpack_sysfs(name);
    let m = load(&Source::SysfsRoot(top.clone())).unwrap();
    (tmp, top, m)
}

/// Captures `top` through a recording view, replays the snapshot, and checks the JSON is the
/// same byte for byte.
fn assert_snapshot_round_trip(top: &std::path::Path, m: &Machine) {
    let rec = Recording::new(DirView::new(top));
    let live = gdpath_topo::sysfs::read_machine(&rec, "sysfs-root").unwrap();
    assert_eq!(&live, m);
    let mut buf = Vec::new();
    let summary = snapshot::capture(&rec, &live.source, None, &mut buf).unwrap();
    assert!(summary.files > 0);
    assert!(summary.refused.is_empty());
    let snap = Snapshot::from_reader(&buf[..], std::path::Path::new("mem.tar.gz")).unwrap();
    assert_eq!(snap.manifest.gdpath_version, env!("CARGO_PKG_VERSION"));
    let replay = snap.machine().unwrap();
    assert_replay_matches(&live, &replay);
    // Exactly the files and links read, nothing more.
    let record = rec.record();
    assert_eq!(snap.manifest.files, record.files.len());
    assert_eq!(snap.manifest.links, record.links.len());
    assert_eq!(snap.manifest.listings, record.listings);
}

#[test]
fn qemu_vm_with_32bit_pci_domain() {
    let (_t, top, m) = read("hwloc-sysfs-2pa-pcidomain32bits.tar.bz2");
    assert!(m.tree_known);
    assert_eq!(m.devices.len(), 9);
    assert_eq!(m.gpus().count(), 0);
    // The virtio block device sits in the 32-bit domain 10000 (five hex digits).
    let blk = dev(&m, "10000:00:04.0");
    assert_eq!(blk.pci.to_string(), "10000:00:04.0");
    assert_eq!(blk.host_bridge.as_deref(), Some("pci10000:00"));
    assert_eq!((blk.vendor, blk.device), (0x1af4, 0x1001));
    assert_eq!(blk.block, ["vda"]);
    // The virtio NIC: in domain 0 in this dump (ens3 -> 0000:00:03.0).
    let nics: Vec<_> = m.nics().collect();
    assert_eq!(nics.len(), 1);
    assert_eq!(nics[0].pci.to_string(), "0000:00:03.0");
    assert_eq!(nics[0].netdevs, ["ens3"]);
    assert_eq!(nics[0].name.as_deref(), Some("virtio network device"));
    assert_eq!(nics[0].numa, None, "numa_node -1 is unknown, not node 0");
    assert!(
        m.warnings().iter().all(|w| w.id != "topo.numa-unknown"),
        "one node: no warning"
    );
    assert_snapshot_round_trip(&top, &m);
}

#[test]
fn sandy_bridge_with_connectx3_and_nvme() {
    let (_t, top, m) = read("hwloc-sysfs-32em64t-2n8c+dax+nvme+mic+dimms.tar.bz2");
    let cx3 = dev(&m, "0000:82:00.0");
    assert_eq!(
        (cx3.vendor, cx3.device, cx3.class),
        (0x15b3, 0x1003, 0x028000)
    );
    assert_eq!(cx3.kind, DeviceKind::Nic);
    assert_eq!(cx3.rdma, ["mlx4_0"]);
    assert_eq!(cx3.netdevs, ["ib0"]);
    assert_eq!(cx3.host_bridge.as_deref(), Some("pci0000:80"));
    assert_eq!(cx3.name.as_deref(), Some("Mellanox ConnectX-3"));
    let nvme = dev(&m, "0000:00:02.0");
    assert_eq!((nvme.vendor, nvme.device), (0x8086, 0x0953));
    assert_eq!(nvme.kind, DeviceKind::Nvme);
    assert_eq!(nvme.block, ["nvme0n1"], "partitions are not listed");
    assert_eq!(nvme.id, "NVME0");
    let i350: Vec<_> = m.nics().filter(|d| d.device == 0x1521).collect();
    assert_eq!(i350.len(), 2);
    assert_eq!(dev(&m, "0000:83:00.0").device, 0x225c, "Xeon Phi");
    // NVMe numa_node is -1; its local CPUs 0-3 lie in node 0, the ConnectX-3 is on node 1.
    assert_eq!(nvme.numa, None);
    assert_eq!(m.numa_of(nvme), Some(0));
    assert_eq!(class(&m, "0000:00:02.0", "0000:82:00.0"), "SYS");
    // The two i350 ports are functions of one device under one root port.
    assert_eq!(class(&m, "0000:02:00.0", "0000:02:00.3"), "PIX");
    assert_eq!(class(&m, "0000:02:00.0", "0000:00:02.0"), "PHB");
    // 64-byte config dumps: ACS unknown; no IOMMU information.
    assert_eq!(dev(&m, "0000:80:02.2").acs, None);
    assert_eq!(m.iommu.enabled(), None);
    assert!(m.warnings().iter().any(|w| w.id == "topo.numa-unknown"));
    assert_snapshot_round_trip(&top, &m);
}

#[test]
fn two_socket_with_qlogic_hca() {
    let (_t, top, m) = read("hwloc-sysfs-40intel64-2g2n4c+pcilocality.tar.bz2");
    let qib = dev(&m, "0000:43:00.0");
    assert_eq!(
        (qib.vendor, qib.device, qib.class),
        (0x1077, 0x7322, 0x0c0600)
    );
    assert_eq!(qib.kind, DeviceKind::Nic);
    assert_eq!(qib.rdma, ["qib0"]);
    assert_eq!(qib.host_bridge.as_deref(), Some("pci0000:40"));
    assert_eq!(qib.numa, Some(2));
    assert_eq!(qib.link.cur_gts, Some(8.0));
    assert_eq!(qib.link.cur_width, Some(4));
    assert_eq!(qib.link.max_gts, None, "no max_link_speed file: unknown");
    let bcm: Vec<_> = m.nics().filter(|d| d.vendor == 0x14e4).collect();
    assert_eq!(bcm.len(), 4);
    assert!(bcm.iter().all(|d| d.device == 0x1639));
    assert_eq!(dev(&m, "0000:01:00.0").vendor, 0x1000, "LSI SAS controller");
    assert_eq!(dev(&m, "0000:01:00.0").kind, DeviceKind::Other);
    // Different host bridges, Broadcom NUMA unknown: NODE (nvidia-smi's convention).
    assert_eq!(class(&m, "0000:02:00.0", "0000:43:00.0"), "NODE");
    assert_eq!(class(&m, "0000:02:00.0", "0000:03:00.0"), "PHB");
    assert_snapshot_round_trip(&top, &m);
}

#[test]
fn power9_gpus_without_pci_tree() {
    let (_t, top, m) = read("hwloc-sysfs-nvidiagpunumanodes.tar.bz2");
    assert!(!m.tree_known);
    assert_eq!(m.gpus().count(), 6);
    assert!(m
        .gpus()
        .all(|g| g.class == 0x030000 && g.parent.is_none() && g.host_bridge.is_none()));
    assert!(m.warnings().iter().any(|w| w.id == "topo.tree-unknown"));
    // GPU memory NUMA nodes from the NVIDIA driver's numa_status.
    assert_eq!(dev(&m, "0004:05:00.0").gpu_numa_id, Some(255));
    // Same socket: the tree would decide, and there is none.
    assert_eq!(class(&m, "0004:05:00.0", "0004:06:00.0"), "N/A");
    // Local CPUs 0-15 (node 0) vs 88-103 (node 8): SYS without needing the tree.
    assert_eq!(class(&m, "0004:05:00.0", "0035:05:00.0"), "SYS");
    let mx = m.matrix();
    assert!(mx.cells.iter().flatten().all(|c| !matches!(
        c,
        LinkClass::Pix | LinkClass::Pxb | LinkClass::Phb | LinkClass::Node
    )));
    assert_snapshot_round_trip(&top, &m);
}
