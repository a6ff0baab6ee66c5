//! Every vendored fixture through every reader: its own reader gives a machine whose coverage
//! (what the source describes, per aspect) is asserted; every other reader refuses it with a
//! typed error, and none panics. And what coverage means for pairs: a source without NVLink
//! gives "PCIe class known, NVLink unknown", with one `topo.nvlink-unknown` warning.

mod common;
use common::*;
use gdpath_topo::{load, Aspect, Facet, LinkClass, Machine, NvLinkState, Source, TopoError};
use std::path::PathBuf;

/// The coverage as one letter per aspect in [`Aspect::ALL`] order (pci-tree, numa, nvlink,
/// link-state, acs, iommu, rdma, drivers): D described, P partial, U unknown.
fn letters(m: &Machine) -> String {
    Aspect::ALL
        .iter()
        .map(|a| match m.coverage.get(*a) {
            Facet::Described { .. } => 'D',
            Facet::Partial { .. } => 'P',
            Facet::Unknown { .. } => 'U',
        })
        .collect()
}

/// Every facet says where it comes from or why it is missing, in words.
fn assert_explained(m: &Machine) {
    for a in Aspect::ALL {
        let text = match m.coverage.get(a) {
            Facet::Described { from } => from.clone(),
            Facet::Partial { from, missing } => format!("{from}{missing}"),
            Facet::Unknown { reason } => reason.clone(),
        };
        assert!(text.len() > 10, "{}: {a:?} unexplained", m.source);
    }
}

fn files(dir: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(fixtures().join(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| !p.to_string_lossy().ends_with(".SOURCE.txt"))
        .collect();
    v.sort();
    v
}

fn name(p: &std::path::Path) -> String {
    p.file_name().unwrap().to_string_lossy().into_owned()
}

#[test]
fn nccl_files() {
    let want = [
        ("nccl-aws-g5.48xl-topo.xml", "DDUUUUUU"),
        ("nccl-aws-p4d-24xl-topo.xml", "DDUPUUUU"),
        ("nccl-azure-ncv4-topo.xml", "DDUUUUDU"),
        ("nccl-azure-ndv2-topo.xml", "DDUPUUUU"),
        ("nccl-azure-ndv4-topo.xml", "DDUPUUUU"),
    ];
    let all = files("nccl-xml");
    assert_eq!(all.len(), want.len(), "a fixture without an expectation");
    for (file, cov) in want {
        let m = load(&Source::NcclXml(fixture(&format!("nccl-xml/{file}")))).unwrap();
        assert_eq!(letters(&m), cov, "{file}");
        assert_explained(&m);
        assert_eq!(m.source, "nccl-xml");
        // No file here describes NVLink; with two GPUs or more that is said once.
        let warned = m
            .warnings()
            .iter()
            .filter(|w| w.id == "topo.nvlink-unknown")
            .count();
        assert_eq!(warned, usize::from(m.gpus().count() >= 2), "{file}");
    }
    let ncv4 = load(&Source::NcclXml(fixture(
        "nccl-xml/nccl-azure-ncv4-topo.xml",
    )))
    .unwrap();
    assert!(ncv4
        .coverage
        .nvlink
        .gap()
        .unwrap()
        .contains("target the GPU itself"));
}

#[test]
fn hwloc_files() {
    let want = [
        ("hwloc-xml-24em64t-2n6c2t-pci.xml", "DDUPUUDU"),
        ("hwloc-xml-32em64t-2n8c2t-pci-normalio.xml", "DDUUUUDU"),
        ("hwloc-xml-power8gpudistances.xml", "DDDPUUUU"),
    ];
    assert_eq!(files("hwloc-xml").len(), want.len());
    for (file, cov) in want {
        let m = load(&Source::HwlocXml(fixture(&format!("hwloc-xml/{file}")))).unwrap();
        assert_eq!(letters(&m), cov, "{file}");
        assert_explained(&m);
    }
}

#[test]
fn sysfs_dumps_and_their_snapshots() {
    let want = [
        ("hwloc-sysfs-2pa-pcidomain32bits.tar.bz2", "DDUUDUUU"),
        (
            "hwloc-sysfs-32em64t-2n8c+dax+nvme+mic+dimms.tar.bz2",
            "DDUUUUDU",
        ),
        (
            "hwloc-sysfs-40intel64-2g2n4c+pcilocality.tar.bz2",
            "DDUPUUDU",
        ),
        ("hwloc-sysfs-nvidiagpunumanodes.tar.bz2", "UDUUUUUU"),
    ];
    assert_eq!(files("hwloc-sysfs").len(), want.len());
    for (file, cov) in want {
        let (_t, top) = unpack_sysfs(file);
        let m = load(&Source::SysfsRoot(top.clone())).unwrap();
        assert_eq!(letters(&m), cov, "{file}");
        assert_explained(&m);
        // Captured and replayed: the same coverage (NVLink unknown for another reason).
        let rec = gdpath_topo::Recording::new(gdpath_topo::DirView::new(&top));
        let live = gdpath_topo::sysfs::read_machine(&rec, "sysfs-root").unwrap();
        let mut buf = Vec::new();
        gdpath_topo::snapshot::capture(&rec, &live.source, None, &mut buf).unwrap();
        let snap = gdpath_topo::snapshot::Snapshot::from_reader(&buf[..], &top).unwrap();
        let replay = snap.machine().unwrap();
        assert_eq!(letters(&replay), cov, "{file} replayed");
        assert_eq!(replay.source, "snapshot");
    }
}

/// The H200 capture: a live machine with its driver facts, so everything but part of the link
/// state (the virtio NIC has none) is described.
#[test]
fn device_capture() {
    let m = load(&Source::Snapshot(fixture(
        "device/h200x1-capture-2026-12-01.tar.gz",
    )))
    .unwrap();
    assert_eq!(letters(&m), "DDDPDDDD");
    assert_explained(&m);
    assert_eq!(m.source, "snapshot");
    assert_eq!(m.captured_from.as_deref(), Some("live"));
    let json = serde_json::to_value(m.report()).unwrap();
    assert_eq!(json["source"], "snapshot");
    assert_eq!(json["captured_from"], "live");
    assert_eq!(json["coverage"]["nvlink"]["state"], "described");
}

#[test]
fn nvidia_smi_texts() {
    let want = [
        ("topo-club3090-1125-2x3090-epyc-node-ns.txt", "UDDUUUDU"),
        ("topo-club3090-1229-2x5090-phb-gns.txt", "UDDUUUDU"),
        ("topo-club3090-178-2x3090-sys.txt", "UDDUUUDU"),
        ("topo-cudasamples-284-l4-2gpu-sys.txt", "UDDUUUDU"),
        // NIC columns but no NIC Legend in the stored copies: RDMA device names unknown.
        ("topo-nccl-1264-hgx-h100-sxm-10nic.txt", "UDDUUUUU"),
        ("topo-nccl-1617-4xh100-nv6-4nic.txt", "UDDUUUUU"),
    ];
    assert_eq!(files("nvidia-smi").len(), want.len());
    for (file, cov) in want {
        let m = load(&Source::SmiTopo(fixture(&format!("nvidia-smi/{file}")))).unwrap();
        assert_eq!(letters(&m), cov, "{file}");
        assert_explained(&m);
        assert_eq!(m.source, "smi-topo");
        assert!(
            m.warnings().iter().all(|w| w.id != "topo.tree-unknown"),
            "{file}: the matrix states the classes, the tree is not needed"
        );
    }
    let probe = load(&Source::SmiTopo(fixture(
        "device/h200x2-probe-2026-11-30.txt",
    )))
    .unwrap();
    assert_eq!(letters(&probe), "UDDUUUDU");
}

/// Each file read by every file reader: its own reader gives a machine (the sysfs tarballs are
/// no reader's file), the others a typed error naming the file — never a panic.
#[test]
fn every_fixture_through_every_reader() {
    let mut checked = 0;
    for dir in [
        "nccl-xml",
        "hwloc-xml",
        "nvidia-smi",
        "device",
        "hwloc-sysfs",
    ] {
        for p in files(dir) {
            let own = match dir {
                "nccl-xml" => Some("nccl-xml"),
                "hwloc-xml" => Some("hwloc-xml"),
                "nvidia-smi" => Some("smi-topo"),
                "device" if name(&p).ends_with(".tar.gz") => Some("snapshot"),
                "device" => Some("smi-topo"), // the probe holds nvidia-smi topo -m output
                _ => None,
            };
            for src in [
                Source::NcclXml(p.clone()),
                Source::HwlocXml(p.clone()),
                Source::SmiTopo(p.clone()),
                Source::Snapshot(p.clone()),
            ] {
                match load(&src) {
                    Ok(m) => assert_eq!(Some(src.kind()), own, "{src:?} read as {}", m.source),
                    Err(e) => {
                        assert_ne!(Some(src.kind()), own, "{src:?}: {e}");
                        assert!(
                            matches!(
                                e,
                                TopoError::Xml { .. }
                                    | TopoError::Io { .. }
                                    | TopoError::Smi { .. }
                                    | TopoError::NotSnapshot { .. }
                            ),
                            "{src:?}: {e}"
                        );
                        assert!(e.to_string().contains(&name(&p)), "{e}");
                    }
                }
                checked += 1;
            }
        }
    }
    assert!(checked >= 4 * 20, "{checked}");
}

/// What the coverage means for pairs.
#[test]
fn pairs_know_what_they_do_not_know() {
    // NCCL without NVLink: every GPU pair has its PCIe class and NVLink unknown; the matrix
    // prints the PCIe class.
    let m = load(&Source::NcclXml(fixture(
        "nccl-xml/nccl-azure-ndv2-topo.xml",
    )))
    .unwrap();
    let gpus: Vec<_> = m.gpus().collect();
    for (i, a) in gpus.iter().enumerate() {
        for b in &gpus[i + 1..] {
            let p = m.pair(a, b);
            assert_eq!(p.nvlink, NvLinkState::Unknown);
            assert!(matches!(p.pcie, LinkClass::Phb | LinkClass::Sys), "{p:?}");
            assert_eq!(m.classify(a, b), p.pcie);
        }
        let nic = m.nics().next().unwrap();
        assert_eq!(
            m.pair(a, nic).nvlink,
            NvLinkState::None,
            "NVLink is a GPU pair's"
        );
    }
    let w = m
        .warnings()
        .into_iter()
        .find(|w| w.id == "topo.nvlink-unknown")
        .unwrap();
    assert!(w.message.contains("nccl-xml") && w.message.contains("<nvlink>"));

    // hwloc with NVLinkBandwidth: joined pairs NV2, the others known to have no NVLink.
    let m = load(&Source::HwlocXml(fixture(
        "hwloc-xml/hwloc-xml-power8gpudistances.xml",
    )))
    .unwrap();
    let (a, b, c) = (
        dev(&m, "0002:01:00.0"),
        dev(&m, "0003:01:00.0"),
        dev(&m, "000a:01:00.0"),
    );
    assert_eq!(m.pair(a, b).nvlink, NvLinkState::Links(2));
    assert_eq!(m.pair(a, b).class(), LinkClass::Nv(2));
    assert_eq!(m.pair(a, c).nvlink, NvLinkState::None);
    assert_eq!(m.pair(a, c).class(), LinkClass::Sys);
    assert!(m.warnings().iter().all(|w| w.id != "topo.nvlink-unknown"));

    // nvidia-smi text: NV# pairs have NVLink and no stated PCIe class.
    let m = load(&Source::SmiTopo(fixture(
        "nvidia-smi/topo-nccl-1264-hgx-h100-sxm-10nic.txt",
    )))
    .unwrap();
    let (g0, g1, n0) = (
        m.by_id("GPU0").unwrap(),
        m.by_id("GPU1").unwrap(),
        m.by_id("NIC0").unwrap(),
    );
    let p = m.pair(g0, g1);
    assert_eq!(
        (p.pcie, p.nvlink),
        (LinkClass::Unknown, NvLinkState::Links(18))
    );
    assert_eq!(m.classify(g0, n0), LinkClass::Pix);
    assert_eq!(m.pair(g0, n0).nvlink, NvLinkState::None);
}

/// Live driver facts make NVLink described; facts without NVML leave it unknown with NVML's
/// error.
#[test]
fn driver_facts_and_nvlink_coverage() {
    let (_t, top) = unpack_sysfs("hwloc-sysfs-nvidiagpunumanodes.tar.bz2");
    let mut m = load(&Source::SysfsRoot(top)).unwrap();
    assert!(m.coverage.nvlink.is_unknown());
    let mut facts = gdpath_topo::facts::DriverFacts::default();
    facts.gaps.push(gdpath_topo::facts::FactGap {
        source: gdpath_topo::facts::FactSource::Nvml,
        what: "all NVML facts".into(),
        reason: "libnvidia-ml.so.1 could not be loaded".into(),
    });
    m.set_driver(facts.clone());
    assert!(m
        .coverage
        .nvlink
        .gap()
        .unwrap()
        .contains("libnvidia-ml.so.1"));
    facts.gaps.clear();
    m.set_driver(facts);
    assert!(m.coverage.nvlink.is_described());
    let g: Vec<_> = m.gpus().collect();
    assert_eq!(m.pair(g[0], g[1]).nvlink, NvLinkState::None);
    assert!(m.warnings().iter().all(|w| w.id != "topo.nvlink-unknown"));
}
