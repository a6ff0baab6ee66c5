//! A report from every vendored machine: the published NCCL and hwloc topologies, the hwloc
//! sysfs dumps, the H200 captures. Each page parses as XML, its drawing shows every device
//! with no two labels overlapping, and the paths drawn are the ones the doctor judges.

mod common;
use common::*;
use gdpath_report::Options;
use gdpath_testkit::{fixture, fixture_files, unpack_sysfs};
use gdpath_topo::Source;
use std::path::PathBuf;

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
        nccl_logs: Vec::new(),
    };
    let html = gdpath_report::report(&opts).unwrap_or_else(|e| panic!("{source:?}: {e}"));
    let machine = gdpath_doctor::load(&source).unwrap().machine;
    (html, machine)
}

/// The findings tables' rows: (class, path cell, id, remedy cell).
fn finding_rows(doc: &roxmltree::Document) -> Vec<(String, String, String, String)> {
    let text = |n: roxmltree::Node| -> String {
        n.descendants()
            .filter(|d| d.is_text())
            .map(|d| d.text().unwrap())
            .collect()
    };
    doc.descendants()
        .filter(|n| n.has_tag_name("table") && n.attribute("class") == Some("findings"))
        .flat_map(|t| t.descendants().filter(|n| n.has_tag_name("tr")))
        .filter_map(|tr| {
            let class = tr.attribute("class")?.to_owned();
            let tds: Vec<String> = tr
                .children()
                .filter(|n| n.has_tag_name("td"))
                .map(text)
                .collect();
            Some((
                class,
                tds[1].clone(),
                tds[2].clone(),
                tds.get(5).cloned().unwrap_or_default(),
            ))
        })
        .collect()
}

fn check(source: Source) -> String {
    let what = format!("{source:?}");
    let (html, m) = report(source.clone());
    let doc = parse(&html);
    // Every row that is not ok says what to do.
    for (class, _, id, remedy) in finding_rows(&doc) {
        if class != "row-ok" {
            assert!(
                !remedy.trim().is_empty(),
                "{what}: {id} ({class}) has no remedy"
            );
        }
    }
    let svg = machine_svg(&doc);
    assert_devices_drawn(svg, &m, &what);
    assert_no_overlap(svg, &what);
    assert_lines_clear(svg, &what);
    // The drawing alone (`topo --svg`) is a document of its own, just as checked.
    let alone = gdpath_report::drawing(&source, &[std::env::temp_dir()]).unwrap();
    let d2 = parse(&alone);
    assert_devices_drawn(d2.root_element(), &m, &what);
    assert_no_overlap(d2.root_element(), &what);
    assert_lines_clear(d2.root_element(), &what);
    html
}

#[test]
fn every_nccl_topology() {
    for p in fixture_files("nccl-xml", ".xml") {
        check(Source::NcclXml(p));
    }
}

#[test]
fn every_nvidia_smi_text() {
    for p in fixture_files("nvidia-smi", ".txt") {
        check(Source::SmiTopo(p));
    }
}

#[test]
fn every_hwloc_xml_topology() {
    for p in fixture_files("hwloc-xml", ".xml") {
        check(Source::HwlocXml(p));
    }
}

#[test]
fn a_machine_without_gpu_lists_system_no_gpu_once() {
    let (_guard, top) = unpack_sysfs("hwloc-sysfs-2pa-pcidomain32bits.tar.bz2");
    let html = check(Source::SysfsRoot(top));
    let doc = parse(&html);
    let rows: Vec<_> = finding_rows(&doc)
        .into_iter()
        .filter(|r| r.2 == "system.no-gpu")
        .collect();
    // The doctor reports it under GDR, GDS and system (each needs a GPU); one row names all
    // three, as `gdpath doctor` prints it once.
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].1, "GDR, GDS, system");
    assert!(rows[0].3.contains("machine with NVIDIA GPUs"), "{rows:?}");
}

#[test]
fn every_hwloc_sysfs_dump() {
    for p in fixture_files("hwloc-sysfs", ".tar.bz2") {
        let name = p.file_name().unwrap().to_str().unwrap().to_owned();
        let (_guard, top) = unpack_sysfs(&name);
        check(Source::SysfsRoot(top));
    }
}

#[test]
fn every_snapshot() {
    let mut snaps = fixture_files("device", ".tar.gz");
    snaps.push(PathBuf::from(gdpath_testkit::h200x2_snapshot()));
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
    let html = check(Source::Snapshot(PathBuf::from(
        gdpath_testkit::h200x2_snapshot(),
    )));
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

/// The box (x, y, width) of a `<rect>` of the given class inside `g`.
fn rect_of(g: roxmltree::Node, class: &str) -> (f64, f64, f64) {
    let r = g
        .descendants()
        .find(|n| n.has_tag_name("rect") && n.attribute("class") == Some(class))
        .unwrap_or_else(|| panic!("no {class} rect"));
    let f = |a: &str| r.attribute(a).unwrap().parse::<f64>().unwrap();
    (f("x"), f("y"), f("width"))
}

#[test]
fn nvidia_smi_nics_sit_on_the_node_of_the_gpu_beside_them() {
    // The HGX H100's text gives the GPUs' NUMA affinity (GPU0–3 node 0, GPU4–7 node 1) and NIC0
    // PIX to GPU0, NIC8 PIX to GPU6, but no NUMA node for any NIC.
    let html = check(Source::SmiTopo(fixture(
        "nvidia-smi/topo-nccl-1264-hgx-h100-sxm-10nic.txt",
    )));
    let doc = parse(&html);
    let svg = machine_svg(&doc);
    let numa = |n: u32| {
        let title = format!("NUMA node {n}");
        let g = svg
            .descendants()
            .find(|g| {
                g.attribute("class") == Some("numa")
                    && g.children()
                        .any(|t| t.has_tag_name("title") && t.text() == Some(title.as_str()))
            })
            .unwrap_or_else(|| panic!("no {title}"));
        rect_of(g, "numa-box")
    };
    let device = |id: &str| {
        let g = svg
            .descendants()
            .find(|g| g.attribute("data-id") == Some(id))
            .unwrap_or_else(|| panic!("no {id}"));
        rect_of(g, "box nic")
    };
    for (nic, node) in [("NIC0", 0), ("NIC8", 1)] {
        let (nx, _, nw) = numa(node);
        let (x, _, w) = device(nic);
        assert!(
            x >= nx && x + w <= nx + nw,
            "{nic} is not under NUMA {node}"
        );
    }
    // Each GPU's GDR path is PIX: it stays under its node, never up at the CPU interconnect
    // above the nodes' boxes.
    let top = numa(0).1.min(numa(1).1);
    let gdr: Vec<_> = svg
        .descendants()
        .filter(|n| {
            n.attribute("data-route")
                .is_some_and(|r| r.starts_with("gdr "))
        })
        .collect();
    assert_eq!(gdr.len(), 8);
    for p in gdr {
        for (a, b) in segments(p.attribute("d").unwrap()) {
            assert!(
                a.1 > top && b.1 > top,
                "{:?} crosses the interconnect",
                p.attribute("data-route")
            );
        }
    }
}

#[test]
fn a_nic_the_text_places_nowhere_gets_no_path_across_the_sockets() {
    // Two GPUs on two NUMA nodes and a NIC whose class to either is not given (N/A): where the
    // NIC attaches is not in the text, so its GDR paths are not drawn (least of all across the
    // CPU interconnect), and a note says so.
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("topo.txt");
    std::fs::write(
        &text,
        "\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n\
         GPU0\t X \tSYS\tN/A\t0-7\t0\t\tN/A\n\
         GPU1\tSYS\t X \tN/A\t8-15\t1\t\tN/A\n\
         NIC0\tN/A\tN/A\t X \t\t\t\t\n\n\
         NIC Legend:\n\n  NIC0: mlx5_0\n",
    )
    .unwrap();
    let html = check(Source::SmiTopo(text));
    let r = routes(&html);
    assert!(!r.iter().any(|(k, _)| k.starts_with("gdr")), "{r:?}");
    assert!(html.contains("Not drawn over the tree: GDR GPU0 ↔ NIC0, GDR GPU1 ↔ NIC0"));
    // The P2P pair is SYS: that crossing the text states, and it is drawn.
    assert!(r.iter().any(|(k, _)| k == "p2p GPU0 GPU1"), "{r:?}");
}
