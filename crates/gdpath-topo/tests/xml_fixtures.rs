//! The hwloc XML and NCCL XML fixtures: devices and pair classes their sources state.

mod common;
use common::*;
use gdpath_topo::{load, DeviceKind, LinkClass, Machine, Source, TopoError};

fn hwloc(name: &str) -> Machine {
    load(&Source::HwlocXml(fixture(&format!("hwloc-xml/{name}")))).unwrap()
}

fn nccl(name: &str) -> Machine {
    load(&Source::NcclXml(fixture(&format!("nccl-xml/{name}")))).unwrap()
}

fn gpu_pcis(m: &Machine) -> Vec<String> {
    m.gpus().map(|g| g.pci.to_string()).collect()
}

#[test]
fn hwloc_westmere_three_teslas_and_connectx() {
    let m = hwloc("hwloc-xml-24em64t-2n6c2t-pci.xml");
    assert_eq!(
        gpu_pcis(&m),
        ["0000:06:00.0", "0000:11:00.0", "0000:14:00.0"]
    );
    assert!(m.gpus().all(|g| (g.vendor, g.device) == (0x10de, 0x06d2)));
    let cx = dev(&m, "0000:05:00.0");
    assert_eq!(
        (cx.vendor, cx.device, cx.kind),
        (0x15b3, 0x6746, DeviceKind::Nic)
    );
    assert_eq!(cx.rdma, ["mlx4_0"]);
    let e1000: Vec<_> = m.nics().filter(|d| d.device == 0x10c9).collect();
    assert_eq!(e1000.len(), 2);
    assert_eq!(e1000[0].netdevs, ["eth0"]);
    assert_eq!(m.numa_nodes.len(), 2);
    // GPU 06 on socket 0; 11 and 14 on socket 1 under one host bridge.
    assert_eq!(class(&m, "0000:06:00.0", "0000:11:00.0"), "SYS");
    assert_eq!(class(&m, "0000:11:00.0", "0000:14:00.0"), "PHB");
    assert_eq!(class(&m, "0000:06:00.0", "0000:05:00.0"), "PHB");
    // pci_link_speed is GB/s (speed × width): kept as the bandwidth; none of this file's values
    // splits into one generation and width.
    assert!(m.devices.iter().all(|d| d.link.cur_gts.is_none()));
    assert_eq!(dev(&m, "0000:06:00.0").link.stated_gbps, Some(4.0));
}

#[test]
fn hwloc_sandy_bridge_normalio() {
    let m = hwloc("hwloc-xml-32em64t-2n8c2t-pci-normalio.xml");
    assert_eq!(
        gpu_pcis(&m),
        ["0000:03:00.0", "0000:83:00.0", "0000:84:00.0"]
    );
    assert!(m.gpus().all(|g| g.device == 0x1094));
    assert!(m.nics().any(|n| n.device == 0x1013 && n.rdma == ["mlx5_0"]));
    let radeon = dev(&m, "0000:84:00.1");
    assert_eq!((radeon.vendor, radeon.kind), (0x1002, DeviceKind::Other));
    assert_eq!(class(&m, "0000:03:00.0", "0000:83:00.0"), "SYS");
    assert_eq!(class(&m, "0000:03:00.0", "0000:84:00.0"), "SYS");
    assert_eq!(class(&m, "0000:83:00.0", "0000:84:00.0"), "PHB");
    // Link speeds are 0 in this file: unknown, not zero.
    assert!(m.devices.iter().all(|d| d.link.limit_gbps().is_none()));
    // The file repeats 0000:04:00.0 (SAS controller and ConnectX-4): noted, not fatal.
    assert!(m.notes.iter().any(|n| n.contains("0000:04:00.0")));
}

#[test]
fn hwloc_power8_nvlink_matrix() {
    let m = hwloc("hwloc-xml-power8gpudistances.xml");
    assert_eq!(
        gpu_pcis(&m),
        [
            "0002:01:00.0",
            "0003:01:00.0",
            "000a:01:00.0",
            "000b:01:00.0"
        ]
    );
    assert!(m.gpus().all(|g| g.device == 0x15f9));
    // 40000 MB/s at 20000 MB/s per NVLink 1 link: NV2, within each socket.
    assert_eq!(class(&m, "0002:01:00.0", "0003:01:00.0"), "NV2");
    assert_eq!(class(&m, "000a:01:00.0", "000b:01:00.0"), "NV2");
    for (a, b) in [
        ("0002:01:00.0", "000a:01:00.0"),
        ("0003:01:00.0", "000b:01:00.0"),
    ] {
        assert_eq!(class(&m, a, b), "SYS");
    }
    assert_eq!(m.nvlinks.len(), 2);
}

#[test]
fn nccl_azure_ndv2() {
    let m = nccl("nccl-azure-ndv2-topo.xml");
    assert_eq!(m.gpus().count(), 8);
    assert_eq!(m.nics().count(), 1);
    let nic = m.nics().next().unwrap().pci.to_string();
    for (i, g) in m.gpus().enumerate() {
        let want = if i < 4 { "PHB" } else { "SYS" };
        assert_eq!(class(&m, &g.pci.to_string(), &nic), want, "GPU{i}");
    }
    assert!(m
        .gpus()
        .all(|g| g.link.max_gts == Some(16.0) && g.link.max_width == Some(16)));
}

#[test]
fn nccl_azure_ndv4() {
    let m = nccl("nccl-azure-ndv4-topo.xml");
    assert_eq!(m.numa_nodes.len(), 4);
    assert_eq!((m.gpus().count(), m.nics().count()), (8, 8));
    // Under ffff:ff:01.0 (NUMA 0): GPUs 0003/0004 and NICs 0103/0104.
    assert_eq!(class(&m, "0003:00:00.0", "0103:00:00.0"), "PIX");
    assert_eq!(class(&m, "0003:00:00.0", "0004:00:00.0"), "PIX");
    assert_eq!(class(&m, "0003:00:00.0", "0101:00:00.0"), "SYS");
    assert!(dev(&m, "ffff:ff:01.0").synthetic);
    let g = dev(&m, "0003:00:00.0");
    assert!((g.link.max_limit_gbps().unwrap() - 31.5).abs() < 0.01);
    assert!(m.warnings().iter().all(|w| w.id != "topo.nic-far"));
}

#[test]
fn nccl_azure_ncv4_self_nvlinks_and_bare_nic() {
    let m = nccl("nccl-azure-ncv4-topo.xml");
    assert_eq!(m.gpus().count(), 4);
    let numas: Vec<_> = m.gpus().map(|g| g.numa).collect();
    assert_eq!(numas, [Some(0), Some(1), Some(2), Some(3)]);
    let nics: Vec<_> = m.nics().collect();
    assert_eq!(nics.len(), 1);
    assert_eq!(nics[0].netdevs, ["eth0"]);
    assert!(nics[0].synthetic);
    // `<net name="eth0" … gdr="0"/>`: NCCL found no GPUDirect RDMA through it.
    assert_eq!(nics[0].nccl_gdr, Some(false));
    assert!(m.nvlinks.is_empty(), "self-targeted nvlinks are ignored");
    assert_eq!(m.notes.iter().filter(|n| n.contains("itself")).count(), 4);
    assert_eq!(
        m.classify(m.by_id("GPU0").unwrap(), nics[0]),
        LinkClass::Phb
    );
    assert!(m.warnings().iter().any(|w| w.id == "topo.nic-far"));
}

#[test]
fn nccl_aws_p4d() {
    let m = nccl("nccl-aws-p4d-24xl-topo.xml");
    assert_eq!((m.gpus().count(), m.nics().count()), (8, 4));
    assert!(
        m.nics().all(|n| n.nccl_gdr.is_none()),
        "no <net> entries, no gdr"
    );
    assert!(m
        .nics()
        .all(|n| n.name.as_deref() == Some("Amazon Elastic Fabric Adapter (EFA)")));
    for sw in ["10", "20", "90", "a0"] {
        let g0 = format!("0000:{sw}:1c.0");
        let g1 = format!("0000:{sw}:1d.0");
        let efa = format!("0000:{sw}:1b.0");
        assert_eq!(class(&m, &g0, &efa), "PIX");
        assert_eq!(class(&m, &g1, &efa), "PIX");
        assert_eq!(class(&m, &g0, &g1), "PIX");
    }
    assert_eq!(class(&m, "0000:10:1c.0", "0000:20:1c.0"), "PHB");
    assert_eq!(class(&m, "0000:10:1c.0", "0000:90:1c.0"), "SYS");
    for n in m.nearest() {
        assert_eq!(n.nic.unwrap().class, LinkClass::Pix);
    }
}

#[test]
fn nccl_aws_g5_bare_entries() {
    let m = nccl("nccl-aws-g5.48xl-topo.xml");
    assert_eq!(m.devices.len(), 9);
    assert!(m
        .devices
        .iter()
        .all(|d| d.kind == DeviceKind::Other && d.class == gdpath_topo::names::UNKNOWN_CLASS));
    assert_eq!(m.numa_nodes.len(), 2);
    assert_eq!(dev(&m, "0000:00:15.0").numa, Some(1));
    assert!(m.matrix().ids.is_empty());
}

#[test]
fn malformed_xml_names_file_and_line() {
    let dir = tempdir();
    let p = dir.path().join("broken.xml");
    std::fs::write(&p, "<system version=\"1\">\n  <cpu numaid=\"0\">\n    <pci busid=\"0000:01:00.0\"\n</system>\n").unwrap();
    for src in [Source::NcclXml(p.clone()), Source::HwlocXml(p.clone())] {
        let err = load(&src).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, TopoError::Xml { line: 4, .. }), "{text}");
        assert!(text.contains("broken.xml:4:"), "{text}");
    }
    // Well-formed, wrong kind.
    std::fs::write(&p, "<topology version=\"2.0\"/>\n").unwrap();
    let err = load(&Source::NcclXml(p.clone())).unwrap_err();
    assert!(err.to_string().contains("not NCCL's <system>"), "{err}");
    // A bad bus id is an error at its line.
    std::fs::write(
        &p,
        "<system>\n<cpu numaid=\"0\">\n<pci busid=\"zz:1\"/>\n</cpu>\n</system>\n",
    )
    .unwrap();
    let err = load(&Source::NcclXml(p.clone())).unwrap_err();
    assert!(matches!(err, TopoError::Xml { line: 3, .. }), "{err}");
    let missing = load(&Source::HwlocXml(dir.path().join("nope.xml"))).unwrap_err();
    assert!(missing.to_string().contains("nope.xml"), "{missing}");
}
