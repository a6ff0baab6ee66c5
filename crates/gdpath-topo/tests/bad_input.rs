//! Missing, unreadable or wrong input: unknown fields or clear errors, never a panic. Also ACS
//! and degraded links, on trees derived in the test (the fixtures' 64-byte config dumps hold no
//! ACS capability).

mod common;
use common::*;
use gdpath_topo::snapshot::Snapshot;
use gdpath_topo::{load, AcsState, DeviceKind, LinkClass, Source, TopoError};

#[test]
fn missing_files_are_unknown_fields() {
    let dir = tempdir();
    let root = dir.path();
    // A GPU with only its class readable, a NIC with nothing but its directory, and an entry
    // that is not a PCI address.
    write(
        root,
        "sys/devices/pci0000:00/0000:00:06.0/class",
        "0x030200\n",
    );
    std::fs::create_dir_all(root.join("sys/devices/pci0000:00/0000:00:07.0")).unwrap();
    symlink(
        root,
        "sys/bus/pci/devices/0000:00:06.0",
        "../../../devices/pci0000:00/0000:00:06.0",
    );
    symlink(
        root,
        "sys/bus/pci/devices/0000:00:07.0",
        "../../../devices/pci0000:00/0000:00:07.0",
    );
    symlink(root, "sys/bus/pci/devices/garbage", "nowhere");
    // Unparsable contents are unknown too.
    write(
        root,
        "sys/devices/pci0000:00/0000:00:07.0/numa_node",
        "lots\n",
    );
    write(
        root,
        "sys/devices/pci0000:00/0000:00:07.0/current_link_speed",
        "Unknown speed\n",
    );
    write(
        root,
        "sys/devices/pci0000:00/0000:00:07.0/local_cpulist",
        "0-99999999\n",
    );
    let m = load(&Source::SysfsRoot(root.to_owned())).unwrap();
    assert_eq!(m.devices.len(), 2);
    assert!(m.notes.iter().any(|n| n.contains("garbage")));
    let g = dev(&m, "0000:00:06.0");
    assert_eq!(g.class, 0x030200);
    assert_eq!(g.vendor, gdpath_topo::names::UNKNOWN_ID);
    assert_eq!(
        g.kind,
        DeviceKind::Other,
        "a display controller of unknown vendor is not a GPU"
    );
    let x = dev(&m, "0000:00:07.0");
    assert_eq!(
        (x.numa, x.cpus.as_deref(), x.link.cur_gts),
        (None, None, None)
    );
    assert_eq!(x.class, gdpath_topo::names::UNKNOWN_CLASS);
    let json = serde_json::to_value(m.report()).unwrap();
    assert_eq!(json["schema"], "gdpath.topo/1");
    assert_eq!(json["devices"][0]["vendor"], serde_json::Value::Null);
    assert_eq!(json["iommu"]["readable"], false);
}

#[test]
fn not_a_sysfs_tree() {
    let dir = tempdir();
    let err = load(&Source::SysfsRoot(dir.path().to_owned())).unwrap_err();
    assert!(matches!(err, TopoError::NotSysfs { .. }), "{err}");
    let err = load(&Source::SysfsRoot(dir.path().join("absent"))).unwrap_err();
    assert!(err.to_string().contains("absent"), "{err}");
}

#[test]
fn not_a_snapshot() {
    let dir = tempdir();
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "hello").unwrap();
    let err = load(&Source::Snapshot(text.clone())).unwrap_err();
    assert!(matches!(err, TopoError::NotSnapshot { .. }), "{err}");
    assert!(err.to_string().contains("notes.txt"), "{err}");

    // A valid tar.gz without a manifest.
    let mut buf = Vec::new();
    {
        let gz = flate2::write::GzEncoder::new(&mut buf, flate2::Compression::default());
        let mut tar = tar::Builder::new(gz);
        let mut h = tar::Header::new_gnu();
        h.set_size(2);
        h.set_mode(0o444);
        tar.append_data(&mut h, "x.txt", &b"hi"[..]).unwrap();
        tar.into_inner().unwrap().finish().unwrap();
    }
    let err = Snapshot::from_reader(&buf[..], std::path::Path::new("plain.tar.gz")).unwrap_err();
    assert!(err.to_string().contains("no manifest.json"), "{err}");

    let err = load(&Source::Snapshot(dir.path().join("missing.tar.gz"))).unwrap_err();
    assert!(matches!(err, TopoError::Io { .. }), "{err}");
}

fn put(cfg: &mut [u8], off: usize, v: u32) {
    cfg[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

/// A PCIe switch (upstream port 00:01.0 → 01:00.0, downstream ports 02:00.0 and 02:01.0) with a
/// GPU and a NIC under it, a second GPU on another root port, full 4 KiB config spaces, and
/// redirect enabled on one downstream port. Links: the NIC trained x8 of x16.
fn switch_tree(root: &std::path::Path) {
    let hb = "sys/devices/pci0000:00";
    let devs: [(&str, &str, &str, &str, &str); 7] = [
        ("0000:00:01.0", "", "0x060400", "0x8086", "0x1234"),
        (
            "0000:01:00.0",
            "0000:00:01.0",
            "0x060400",
            "0x10b5",
            "0xc010",
        ),
        (
            "0000:02:00.0",
            "0000:00:01.0/0000:01:00.0",
            "0x060400",
            "0x10b5",
            "0xc010",
        ),
        (
            "0000:02:01.0",
            "0000:00:01.0/0000:01:00.0",
            "0x060400",
            "0x10b5",
            "0xc010",
        ),
        (
            "0000:03:00.0",
            "0000:00:01.0/0000:01:00.0/0000:02:00.0",
            "0x030200",
            "0x10de",
            "0x2330",
        ),
        (
            "0000:04:00.0",
            "0000:00:01.0/0000:01:00.0/0000:02:01.0",
            "0x020000",
            "0x15b3",
            "0x1021",
        ),
        ("0000:00:02.0", "", "0x030200", "0x10de", "0x2330"),
    ];
    for (bdf, above, class, vendor, device) in devs {
        let d = if above.is_empty() {
            format!("{hb}/{bdf}")
        } else {
            format!("{hb}/{above}/{bdf}")
        };
        write(root, &format!("{d}/class"), class);
        write(root, &format!("{d}/vendor"), vendor);
        write(root, &format!("{d}/device"), device);
        write(root, &format!("{d}/numa_node"), "0");
        let mut cfg = vec![0u8; 4096];
        put(&mut cfg, 0x100, 0x000d | (1 << 16));
        let ctrl: u32 = if bdf == "0000:02:01.0" { 0x1d } else { 0 };
        put(&mut cfg, 0x104, 0x7f | (ctrl << 16));
        std::fs::write(root.join(format!("{d}/config")), &cfg).unwrap();
        let (cw, mw) = if bdf == "0000:04:00.0" {
            ("8", "16")
        } else {
            ("16", "16")
        };
        write(root, &format!("{d}/current_link_speed"), "32.0 GT/s PCIe");
        write(root, &format!("{d}/max_link_speed"), "32.0 GT/s PCIe");
        write(root, &format!("{d}/current_link_width"), cw);
        write(root, &format!("{d}/max_link_width"), mw);
        symlink(
            root,
            &format!("sys/bus/pci/devices/{bdf}"),
            &format!("../../../{}", &d["sys/".len()..]),
        );
    }
    write(root, "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0/infiniband/mlx5_0/x", "");
    symlink(root, "sys/class/infiniband/mlx5_0", "../../devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0/infiniband/mlx5_0");
}

#[test]
fn acs_redirect_and_degraded_link_warnings() {
    let dir = tempdir();
    switch_tree(dir.path());
    let m = load(&Source::SysfsRoot(dir.path().to_owned())).unwrap();
    let (g0, g1, nic) = (
        m.by_id("GPU0").unwrap(),
        m.by_id("GPU1").unwrap(),
        m.by_id("NIC0").unwrap(),
    );
    assert_eq!(g0.pci.to_string(), "0000:00:02.0");
    assert_eq!(nic.rdma, ["mlx5_0"]);
    // GPU1 and the NIC share the switch: PIX; GPU0 is on another root port: PHB.
    assert_eq!(m.classify(g1, nic), LinkClass::Pix);
    assert_eq!(m.classify(g0, g1), LinkClass::Phb);
    let bridges: Vec<String> = m
        .bridges_between(g1, nic)
        .iter()
        .map(|b| b.pci.to_string())
        .collect();
    assert_eq!(bridges, ["0000:02:00.0", "0000:01:00.0", "0000:02:01.0"]);
    let between_gpus: Vec<String> = m
        .bridges_between(g0, g1)
        .iter()
        .map(|b| b.pci.to_string())
        .collect();
    assert_eq!(
        between_gpus,
        ["0000:00:01.0", "0000:01:00.0", "0000:02:00.0"],
        "from GPU0 to GPU1"
    );
    assert!(dev(&m, "0000:02:01.0").acs.unwrap().redirects_p2p());
    assert!(matches!(
        dev(&m, "0000:02:00.0").acs,
        Some(AcsState::Present { .. })
    ));
    assert!(!dev(&m, "0000:02:00.0").acs.unwrap().redirects_p2p());
    let w = m.warnings();
    let acs: Vec<_> = w.iter().filter(|w| w.id == "topo.acs-redirect").collect();
    assert_eq!(acs.len(), 1, "{w:?}");
    assert!(acs[0].message.contains("0000:02:01.0") && acs[0].message.contains("GPU1↔NIC0"));
    let deg: Vec<_> = w.iter().filter(|w| w.id == "topo.link-degraded").collect();
    assert_eq!(deg.len(), 1, "{w:?}");
    assert!(
        deg[0].message.contains("Gen5 x8") && deg[0].message.contains("Gen5 x16"),
        "{}",
        deg[0].message
    );
    let near = m.nearest();
    assert_eq!(near[1].nic.as_ref().unwrap().class, LinkClass::Pix);
    assert_eq!(near[0].nic.as_ref().unwrap().class, LinkClass::Phb);
}
