//! A report from every vendored machine: the published NCCL and hwloc topologies, the hwloc
//! sysfs dumps, the H200 captures. Each page parses as XML, its drawing shows every device
//! with no two labels overlapping, and the paths drawn are the ones the doctor judges.

mod common;
use common::*;
use gdpath_report::Options;
use gdpath_testkit::{fixture, fixtures, unpack_sysfs};
use gdpath_topo::Source;
use std::path::{Path, PathBuf};

/// The report page and the machine it was made of.
fn report(source: Source) -> (String, gdpath_topo::Machine) {
    // GDS is checked in a scratch directory, not wherever the test runs.
    let dir = tempfile::tempdir().unwrap();
    let opts = Options {
        source: source.clone(),
        paths: vec![dir.path().to_owned()],
        from: Vec::new(),
        measure: false,
        argv: vec!["gdpath".into(), "report".into()],
    };
    let html = gdpath_report::report(&opts).unwrap_or_else(|e| panic!("{source:?}: {e}"));
    let machine = gdpath_doctor::load(&source).unwrap().machine;
    (html, machine)
}

fn check(source: Source) -> String {
    let what = format!("{source:?}");
    let (html, m) = report(source.clone());
    let doc = parse(&html);
    let svg = machine_svg(&doc);
    assert_devices_drawn(svg, &m, &what);
    assert_no_overlap(svg, &what);
    // The drawing alone (`topo --svg`) is a document of its own, just as checked.
    let alone = gdpath_report::drawing(&source, &[std::env::temp_dir()]).unwrap();
    let d2 = parse(&alone);
    assert_devices_drawn(d2.root_element(), &m, &what);
    assert_no_overlap(d2.root_element(), &what);
    html
}

fn files(dir: &str, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(fixtures().join(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(ext))
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no {ext} fixtures in {dir}");
    v
}

#[test]
fn every_nccl_topology() {
    for p in files("nccl-xml", ".xml") {
        check(Source::NcclXml(p));
    }
}

#[test]
fn every_hwloc_xml_topology() {
    for p in files("hwloc-xml", ".xml") {
        check(Source::HwlocXml(p));
    }
}

#[test]
fn every_hwloc_sysfs_dump() {
    for p in files("hwloc-sysfs", ".tar.bz2") {
        let name = p.file_name().unwrap().to_str().unwrap().to_owned();
        let (_guard, top) = unpack_sysfs(&name);
        check(Source::SysfsRoot(top));
    }
}

#[test]
fn every_snapshot() {
    let mut snaps = files("device", ".tar.gz");
    snaps.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/snapshots/h200x2.tar.gz"));
    for p in snaps {
        check(Source::Snapshot(p));
    }
}

/// The `data-route` paths of a page, with their classes.
fn routes(html: &str) -> Vec<(String, String)> {
    let doc = parse(html);
    machine_svg(&doc)
        .descendants()
        .filter_map(|n| {
            Some((
                n.attribute("data-route")?.to_owned(),
                n.attribute("class")?.to_owned(),
            ))
        })
        .collect()
}

#[test]
fn the_h200_pair_draws_p2p_over_nvlink_and_gdr_through_host_memory() {
    let html = check(Source::Snapshot(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/snapshots/h200x2.tar.gz"),
    ));
    let r = routes(&html);
    // The pair is joined by 18 NVLinks and every P2P check passed: the direct path.
    assert!(
        r.contains(&("p2p GPU0 GPU1".into(), "route p2p direct".into())),
        "{r:?}"
    );
    // No RDMA NIC (virtio eth0 only): network data goes through host memory.
    assert!(
        r.contains(&("gdr GPU0 NIC0".into(), "route gdr staged".into())),
        "{r:?}"
    );
    assert!(
        r.contains(&("gdr GPU1 NIC0".into(), "route gdr staged".into())),
        "{r:?}"
    );
    assert!(
        !r.iter().any(|(k, _)| k.starts_with("gds")),
        "no NVMe, no GDS path: {r:?}"
    );
    assert!(html.contains("NV18: 18 NVLinks between GPU0 and GPU1"));
    // The matrix: both ordered cells of the pair direct.
    assert_eq!(html.matches("class=\"mx-direct\"").count(), 2);
}

#[test]
fn the_two_socket_machine_stages_gdr_across_sockets_and_leaves_p2p_unknown() {
    let html = check(Source::HwlocXml(fixture(
        "hwloc-xml/hwloc-xml-32em64t-2n8c2t-pci-normalio.xml",
    )));
    let r = routes(&html);
    // GPU0 is on socket 0, its only RDMA NIC (mlx5_0) on socket 1: NCCL turns GDR off (SYS).
    assert!(
        r.contains(&("gdr GPU0 NIC0".into(), "route gdr staged".into())),
        "{r:?}"
    );
    // GPU2 shares a PCIe switch with it: nothing says no, the replay cannot say yes.
    assert!(
        r.contains(&("gdr GPU2 NIC0".into(), "route gdr unknown".into())),
        "{r:?}"
    );
    // Three GPUs: P2P is in the matrix. Over PCIe alone every pair would be staged (across
    // sockets, or PHB above NCCL's P2P level), but the export does not describe NVLink, which
    // could join them: every pair unknown, none drawn as staged.
    assert!(!r.iter().any(|(k, _)| k.starts_with("p2p")), "{r:?}");
    assert_eq!(html.matches("class=\"mx-unknown\"").count(), 6);
    assert_eq!(html.matches("class=\"mx-staged\"").count(), 0);
    // Two NUMA nodes and the interconnect between them.
    assert!(html.contains("NUMA 0") && html.contains("NUMA 1"));
    assert!(html.contains("CPU interconnect between NUMA nodes"));
}

#[test]
fn the_p4d_cannot_tell_from_its_file_and_says_so() {
    let html = check(Source::NcclXml(fixture(
        "nccl-xml/nccl-aws-p4d-24xl-topo.xml",
    )));
    let r = routes(&html);
    // Eight GPU–NIC paths, each under its PCIe switch (PIX), not known from a file.
    let gdr: Vec<_> = r.iter().filter(|(k, _)| k.starts_with("gdr")).collect();
    assert_eq!(gdr.len(), 8, "{r:?}");
    assert!(gdr.iter().all(|(_, c)| c == "route gdr unknown"), "{gdr:?}");
    // 28 pairs in the matrix, 56 cells, all unknown (ACS and IOMMU are not in the file).
    assert_eq!(html.matches("class=\"mx-unknown\"").count(), 56);
    // Four PCIe switches, NCCL's virtual ones.
    assert_eq!(
        html.matches("PCIe switch").count() - html.matches("PCIe switch:").count(),
        4
    );
    // The findings table compresses the 28 pairs.
    assert!(
        html.contains("all 28 pairs of GPU0–7"),
        "pairs not compressed"
    );
}
