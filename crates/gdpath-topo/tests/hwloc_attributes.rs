//! What hwloc records beyond the PCI tree: GPU model names in the OS devices' info attributes,
//! `pci_link_speed`, the NVLinkBandwidth matrix, RDMA NICs (EFA among them) and OS-device names.
//! The vendored exports lack some of these (no EFA, no A100, no Gen1 x1 link): where a test needs
//! one it derives a variant of a vendored file in the test, by the text edits it names.

mod common;
use common::*;
use gdpath_topo::hwloc;
use gdpath_topo::{DeviceKind, Machine, RdmaEvidence};
use std::path::Path;

fn text(name: &str) -> String {
    std::fs::read_to_string(fixture(&format!("hwloc-xml/{name}"))).unwrap()
}

fn parse(text: &str) -> Machine {
    hwloc::parse(text, Path::new("variant.xml")).unwrap()
}

/// `text` with `from` replaced by `to`, checking that `from` is there.
fn edit(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "the vendored file has no {from:?}");
    text.replace(from, to)
}

const POWER8: &str = "hwloc-xml-power8gpudistances.xml";
const WESTMERE: &str = "hwloc-xml-24em64t-2n6c2t-pci.xml";
const NORMALIO: &str = "hwloc-xml-32em64t-2n8c2t-pci-normalio.xml";

#[test]
fn gpu_model_from_os_device_info() {
    // Vendored: the P100's id is in gdpath's table, which names it; GPUModel agrees.
    let m = parse(&text(POWER8));
    let g = m.by_id("GPU0").unwrap();
    assert_eq!(g.name.as_deref(), Some("NVIDIA Tesla P100 SXM2 16GB"));
    assert!(m.notes.iter().all(|n| !n.contains("GPUModel")));

    // Variant: device id 10de:15fa, not in the table — the GPUModel of its CUDA/NVML/OpenCL OS
    // devices names it (before, the GPU was named after its vendor and class).
    let m = parse(&edit(&text(POWER8), "[10de:15f9]", "[10de:15fa]"));
    assert!(m
        .gpus()
        .all(|g| g.name.as_deref() == Some("NVIDIA Tesla P100-SXM2-16GB")));

    // Vendored: the Radeon's OpenCL OS device names it; a GPUModel that contradicts the PCI id
    // (this test file says K40m for a 10de:1094 Tesla M2075) is noted, the PCI id kept.
    let m = parse(&text(NORMALIO));
    let radeon = dev(&m, "0000:84:00.1");
    assert_eq!(
        radeon.name.as_deref(),
        Some("AMD Radeon R9 200 / HD 7900 Series")
    );
    assert_eq!(
        dev(&m, "0000:84:00.0").name.as_deref(),
        Some("NVIDIA Tesla M2075")
    );
    assert!(
        m.notes
            .iter()
            .any(|n| n.contains("0000:84:00.0") && n.contains("K40m")),
        "{:?}",
        m.notes
    );
}

#[test]
fn pci_link_speed_is_the_links_bandwidth() {
    // Vendored: 4.0 GB/s for the Westmere's Teslas (Gen1 x16 or Gen2 x8 — not split).
    let m = parse(&text(WESTMERE));
    let g = dev(&m, "0000:06:00.0");
    assert_eq!(g.link.stated_gbps, Some(4.0));
    assert_eq!((g.link.cur_gts, g.link.cur_width), (None, None));
    assert_eq!(g.link.limit_gbps(), Some(4.0));
    let json = serde_json::to_value(g).unwrap();
    assert_eq!(json["link"]["stated_gbps"], 4.0);
    // A value no PCIe link gives (0.2 GB/s on the 82576) is kept as stated.
    assert_eq!(dev(&m, "0000:04:00.0").link.stated_gbps, Some(0.2));

    // Vendored POWER8: the bridges' 7.88 GB/s is the current link; the GPUs' 15.75 was written
    // by hwloc's NVML backend as the maximum width at the Gen3 rate: x16, generation unknown.
    let m = parse(&text(POWER8));
    let br = dev(&m, "0002:00:00.0");
    assert_eq!(br.link.stated_gbps, Some(7.876923));
    let g = dev(&m, "0002:01:00.0");
    assert_eq!((g.link.max_width, g.link.max_gts), (Some(16), None));
    assert_eq!(g.link.stated_gbps, None);

    // Variant: 0.25 GB/s is Gen1 x1 and nothing else, so speed and width are derived.
    let m = parse(&edit(
        &text(WESTMERE),
        "pci_busid=\"0000:04:00.0\" pci_type=\"0200 [8086:10c9] [003c:003f] 01 00\" \
         pci_link_speed=\"0.200000\"",
        "pci_busid=\"0000:04:00.0\" pci_type=\"0200 [8086:10c9] [003c:003f] 01 00\" \
         pci_link_speed=\"0.250000\"",
    ));
    let nic = dev(&m, "0000:04:00.0");
    assert_eq!((nic.link.cur_gts, nic.link.cur_width), (Some(2.5), Some(1)));
    assert_eq!(nic.link.cur_text(), "Gen1 x1");
}

#[test]
fn nvlink_bandwidth_units_by_nvlink_version() {
    // Vendored: 40000 MB/s between P100s at 20000 per NVLink 1 link: NV2.
    let m = parse(&text(POWER8));
    assert_eq!(class(&m, "0002:01:00.0", "0003:01:00.0"), "NV2");

    // Variant: A100s (10de:20b2, NVLink 3) at 600000 MB/s — hwloc counts 50000 per link: NV12.
    let t = edit(&text(POWER8), "[10de:15f9]", "[10de:20b2]");
    let m = parse(&edit(&t, "40000", "600000"));
    assert_eq!(class(&m, "0002:01:00.0", "0003:01:00.0"), "NV12");
    assert_eq!(class(&m, "0002:01:00.0", "000a:01:00.0"), "SYS");

    // Variant: a device id whose NVLink version gdpath does not know (10de:2901): the count
    // assumes NVLink 2's 25000 and says so.
    let m = parse(&edit(&text(POWER8), "[10de:15f9]", "[10de:2901]"));
    assert_eq!(class(&m, "0002:01:00.0", "0003:01:00.0"), "NV2");
    assert!(m.notes.iter().any(|n| n.contains("25000 MB/s per link")));
}

#[test]
fn efa_and_other_rdma_nics_by_identity() {
    // Variant of the Westmere export: its ConnectX (0c06 [15b3:6746], OS devices eth2, ib0,
    // mlx4_0) becomes an EFA (0200 [1d0f:efa1]) whose OpenFabrics device is rdmap16s27.
    let t = edit(
        &text(WESTMERE),
        "pci_type=\"0c06 [15b3:6746] [003c:0049] b0 00\"",
        "pci_type=\"0200 [1d0f:efa1] [1d0f:efa1] 00 00\"",
    );
    let t = edit(
        &t,
        "name=\"mlx4_0\" osdev_type=\"48\"",
        "name=\"rdmap16s27\" osdev_type=\"32\"",
    );
    let m = parse(&t);
    let efa = dev(&m, "0000:05:00.0");
    assert_eq!(efa.kind, DeviceKind::Nic);
    assert_eq!(efa.rdma, ["rdmap16s27"]);
    assert_eq!(
        efa.name.as_deref(),
        Some("Amazon Elastic Fabric Adapter (EFA)")
    );
    assert_eq!(efa.rdma_capable(), Some(RdmaEvidence::Device("rdmap16s27")));

    // The same without its OS devices (an export made without I/O device discovery): RDMA
    // capable by its PCI identity, as the doctor judges it.
    let start = t.find("<object type=\"OSDev\" gp_index=\"43\"").unwrap();
    let end = t.find("name=\"rdmap16s27\" osdev_type=\"32\"/>").unwrap()
        + "name=\"rdmap16s27\" osdev_type=\"32\"/>".len();
    let bare = format!("{}{}", &t[..start], &t[end..]);
    let m = parse(&bare);
    let efa = dev(&m, "0000:05:00.0");
    assert!(efa.rdma.is_empty());
    assert_eq!(
        efa.rdma_capable(),
        Some(RdmaEvidence::Identity("Amazon EFA"))
    );
    assert_eq!(
        efa.rdma_capable().unwrap().to_string(),
        "Amazon EFA, by its PCI identity"
    );
    // An Intel 82576 is no RDMA NIC by identity.
    assert_eq!(dev(&m, "0000:04:00.0").rdma_capable(), None);
}

#[test]
fn os_device_names_once() {
    // Variant: the ConnectX's mlx4_0 listed a second time (as hwloc may list one device as
    // both an OpenFabrics and a network OS device, or twice in a merged export).
    let t = edit(
        &text(WESTMERE),
        "<object type=\"OSDev\" gp_index=\"45\" id=\"obj45\" name=\"mlx4_0\" osdev_type=\"48\"/>",
        "<object type=\"OSDev\" gp_index=\"45\" id=\"obj45\" name=\"mlx4_0\" osdev_type=\"48\"/>\
         <object type=\"OSDev\" gp_index=\"46\" id=\"obj46x\" name=\"mlx4_0\" osdev_type=\"32\"/>\
         <object type=\"OSDev\" gp_index=\"47\" id=\"obj47x\" name=\"ib0\" osdev_type=\"16\"/>",
    );
    let m = parse(&t);
    let cx = dev(&m, "0000:05:00.0");
    assert_eq!(cx.rdma, ["mlx4_0"]);
    assert_eq!(cx.netdevs, ["eth2", "ib0"]);
}
