//! GPU products without NVLink (PCIe-only SKUs, `gdpath_topo::device::PCIE_ONLY_GPUS`): their
//! pairs move P2P data over PCIe whatever the source says of NVLink, so the PCIe path decides
//! the verdict even where the source does not describe NVLink (a sysfs tree without driver
//! facts). An NVLink-capable product in the same place stays unknown.
//!
//! The tree is built here: a two-socket server, each socket a root port above a PCIe switch
//! whose two downstream ports each hold a GPU, with ACS Request and Completion Redirect set on
//! the downstream ports (as a BIOS with ACS on leaves them); no IOMMU, no RDMA device, no
//! driver facts.

mod doctor_common;
use doctor_common::*;
use gdpath::finding::ids;
use gdpath::Status;
use std::path::Path;

/// One PCI function at canonical path `sys/devices/{path}` (its last component is its
/// address), with its `sys/bus/pci/devices` link.
fn function(root: &Path, path: &str, class: &str, id: &str, numa: u32, config: Option<Vec<u8>>) {
    let dir = format!("sys/devices/{path}");
    let (vendor, device) = id.split_once(':').unwrap();
    write(root, &format!("{dir}/class"), format!("{class}\n"));
    write(root, &format!("{dir}/vendor"), format!("0x{vendor}\n"));
    write(root, &format!("{dir}/device"), format!("0x{device}\n"));
    write(root, &format!("{dir}/numa_node"), format!("{numa}\n"));
    let cpus = if numa == 0 { "0-31" } else { "32-63" };
    write(root, &format!("{dir}/local_cpulist"), format!("{cpus}\n"));
    if let Some(c) = config {
        write(root, &format!("{dir}/config"), c);
    }
    let bdf = path.rsplit('/').next().unwrap();
    symlink(
        root,
        &format!("sys/bus/pci/devices/{bdf}"),
        &format!("../../../devices/{path}"),
    );
}

/// The two-socket tree with GPUs of PCI id `gpu` (`10de:26b9` for L40S).
fn two_socket_tree(gpu: &str) -> tempfile::TempDir {
    let tmp = scratch();
    let root = tmp.path();
    let bridge = "0x060400";
    // ACS on every bridge's config space: Request and Completion Redirect on the downstream
    // ports, nothing on the root ports and upstream ports.
    let acs = |control: u16| Some(config_with_acs(&[0u8; 64], control));
    for (numa, bus) in [(0u32, 0x00u32), (1, 0x80)] {
        let host = format!("pci0000:{bus:02x}");
        let rp = format!("{host}/0000:{bus:02x}:01.0");
        let up = format!("{rp}/0000:{:02x}:00.0", bus + 1);
        function(root, &rp, bridge, "8086:347a", numa, acs(0));
        function(root, &up, bridge, "10b5:c010", numa, acs(0));
        for port in 0..2u32 {
            let down = format!("{up}/0000:{:02x}:{port:02x}.0", bus + 2);
            function(root, &down, bridge, "10b5:c010", numa, acs(0x4 | 0x8));
            let g = format!("{down}/0000:{:02x}:00.0", bus + 3 + port);
            function(root, &g, "0x030200", gpu, numa, None);
        }
        write(
            root,
            &format!("sys/devices/system/node/node{numa}/cpulist"),
            if numa == 0 { "0-31\n" } else { "32-63\n" },
        );
    }
    for d in [
        "sys/class/infiniband",
        "sys/class/iommu",
        "sys/kernel/iommu_groups",
    ] {
        mkdir(root, d);
    }
    tmp
}

#[test]
fn l40s_pairs_under_one_switch_with_acs_redirect_are_degraded_without_nvlink_facts() {
    let tree = two_socket_tree("10de:26b9");
    let r = doctor_on(tree.path(), |_| {});
    // The source does not describe NVLink (no driver facts) ...
    assert!(r.coverage.nvlink.is_unknown());
    // ... yet an L40S has no NVLink: the PCIe path decides.
    for pair in ["GPU0-GPU1", "GPU2-GPU3"] {
        let f = find(&r, ids::P2P_ACS_ENABLED, pair);
        assert_eq!(f.status, Status::Degraded, "{pair}: {}", f.evidence);
        assert!(
            f.evidence
                .contains("ACS redirects P2P requests and completions")
                && f.evidence.contains("ACS control RR CR")
                && !f.evidence.contains("NVLink"),
            "{pair}: {}",
            f.evidence
        );
    }
    // Across the sockets the path is SYS: degraded too, not unknown.
    let x = find(&r, ids::P2P_CROSS_SOCKET, "GPU0-GPU2");
    assert_eq!(x.status, Status::Degraded, "{}", x.evidence);
    assert!(!x.evidence.contains("NVLink"), "{}", x.evidence);
}

#[test]
fn an_nvlink_capable_product_in_the_same_tree_stays_unknown() {
    // H100 SXM5 (10de:2330): NVLink by design, which the source does not describe.
    let tree = two_socket_tree("10de:2330");
    let r = doctor_on(tree.path(), |_| {});
    let f = find(&r, ids::P2P_ACS_ENABLED, "GPU0-GPU1");
    assert_eq!(f.status, Status::Unknown, "{}", f.evidence);
    assert!(
        f.evidence.contains("NVLink is not in the source"),
        "{}",
        f.evidence
    );
}

/// `fixture` with every `from` replaced by `to`, written to a scratch file.
fn derived(fixture_rel: &str, from: &str, to: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let text = std::fs::read_to_string(fixture(fixture_rel)).unwrap();
    assert!(text.contains(from), "{fixture_rel} has no {from}");
    let tmp = scratch();
    let file = tmp.path().join("derived.xml");
    std::fs::write(&file, text.replace(from, to)).unwrap();
    (tmp, file)
}

/// NCCL and hwloc XML carry PCI device ids too. Derived: AWS p4d's NCCL file (A100 SXM4,
/// NVLink through NVSwitches, which the file does not describe) with its GPUs' device id made
/// an L40S's, and an hwloc export's three Tesla M2070 made T4s: the cross-socket pairs, unknown
/// for the original products, are degraded.
#[test]
fn pcie_only_products_are_recognised_in_nccl_and_hwloc_xml() {
    let (_t, file) = derived(
        "nccl-xml/nccl-aws-p4d-24xl-topo.xml",
        r#"device="0x20b0""#,
        r#"device="0x26b9""#,
    );
    let r = doctor_on_source(gdpath::topo::Source::NcclXml(file));
    assert!(r.coverage.nvlink.is_unknown());
    let x = find(&r, ids::P2P_CROSS_SOCKET, "GPU0-GPU4");
    assert_eq!(x.status, Status::Degraded, "{}", x.evidence);

    let hwloc = "hwloc-xml/hwloc-xml-24em64t-2n6c2t-pci.xml";
    let r = doctor_on_source(gdpath::topo::Source::HwlocXml(fixture(hwloc)));
    assert_eq!(
        status(&r, ids::P2P_CROSS_SOCKET, "GPU0-GPU1"),
        Status::Unknown
    );
    let (_t, file) = derived(hwloc, "[10de:06d2]", "[10de:1eb8]");
    let r = doctor_on_source(gdpath::topo::Source::HwlocXml(file));
    for pair in ["GPU0-GPU1", "GPU0-GPU2"] {
        let x = find(&r, ids::P2P_CROSS_SOCKET, pair);
        assert_eq!(x.status, Status::Degraded, "{pair}: {}", x.evidence);
    }
}
