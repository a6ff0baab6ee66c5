//! `nvidia-smi topo -m` text: the posted matrices in fixtures/nvidia-smi parse, render
//! and parse back to the same matrix; read as a source they give back their matrix; the
//! formats of other versions (derived in the test from the vendored texts) parse; the legend
//! matches nvidia-smi's; and the H200 machine of fixtures/device, rebuilt as a sysfs tree from
//! the facts its probe states, gives the probe's cells.

mod common;
use common::*;
use gdpath_topo::facts::DriverFacts;
use gdpath_topo::smi::{legend_lines, SmiMatrix};
use gdpath_topo::snapshot::{self, Snapshot};
use gdpath_topo::{sysfs, DirView, LinkClass, Recording};

fn smi(name: &str) -> (String, SmiMatrix) {
    let text = std::fs::read_to_string(fixture(&format!("nvidia-smi/{name}"))).unwrap();
    let m = SmiMatrix::parse(&text).unwrap();
    (text, m)
}

fn assert_round_trip(m: &SmiMatrix) {
    let again = SmiMatrix::parse(&m.to_text()).unwrap();
    assert_eq!(&again, m);
    for r in &m.rows {
        let i = m.ids.iter().position(|x| *x == r.id).unwrap();
        assert_eq!(r.cells[i], LinkClass::X, "{} diagonal", r.id);
        for (j, c) in r.cells.iter().enumerate() {
            if let Some(other) = m.row(&m.ids[j]) {
                assert_eq!(other.cells[i], *c, "{} vs {} symmetric", r.id, m.ids[j]);
            }
        }
    }
}

#[test]
fn hgx_h100_ten_nics() {
    let (_, m) = smi("topo-nccl-1264-hgx-h100-sxm-10nic.txt");
    assert_eq!(m.ids.len(), 18);
    assert_eq!(m.rows.len(), 11, "the stored copy stops after NIC2");
    for g in 0..8 {
        let id = format!("GPU{g}");
        let row = m.row(&id).unwrap();
        let nv = row.cells[..8]
            .iter()
            .filter(|c| **c == LinkClass::Nv(18))
            .count();
        assert_eq!(nv, 7, "{id}: NV18 to every other GPU");
        let pix = row.cells[8..]
            .iter()
            .filter(|c| **c == LinkClass::Pix)
            .count();
        assert_eq!(pix, 1, "{id}: exactly one PIX NIC");
        assert_eq!(
            row.numa_affinity.as_deref(),
            Some(if g < 4 { "0" } else { "1" })
        );
        assert_eq!(row.gpu_numa_id.as_deref(), Some("N/A"));
    }
    assert_eq!(
        m.row("GPU4").unwrap().cpu_affinity.as_deref(),
        Some("56-111,168-223")
    );
    assert_eq!(m.row("NIC0").unwrap().cpu_affinity, None);
    assert_round_trip(&m);
    // The text has no node list: the machine's nodes are those its GPUs name.
    let machine = m.to_machine();
    assert!(machine.numa_nodes.is_empty());
    assert_eq!(
        machine.numa_node_ids().into_iter().collect::<Vec<_>>(),
        vec![0, 1]
    );
}

#[test]
fn four_h100_nv6() {
    let (_, m) = smi("topo-nccl-1617-4xh100-nv6-4nic.txt");
    assert_eq!(m.get("GPU0", "GPU3"), Some(LinkClass::Nv(6)));
    assert_eq!(m.get("GPU2", "NIC2"), Some(LinkClass::Pix));
    assert_eq!(m.get("GPU2", "NIC0"), Some(LinkClass::Sys));
    assert_eq!(m.row("GPU2").unwrap().numa_affinity.as_deref(), Some("7"));
    assert_round_trip(&m);
}

#[test]
fn pairs_of_consumer_gpus() {
    for (file, want) in [
        ("topo-cudasamples-284-l4-2gpu-sys.txt", LinkClass::Sys),
        ("topo-club3090-1229-2x5090-phb-gns.txt", LinkClass::Phb),
        (
            "topo-club3090-1125-2x3090-epyc-node-ns.txt",
            LinkClass::Node,
        ),
        ("topo-club3090-178-2x3090-sys.txt", LinkClass::Sys),
    ] {
        let (_, m) = smi(file);
        assert_eq!(m.ids, ["GPU0", "GPU1"], "{file}");
        assert_eq!(
            m.rows.len(),
            2,
            "{file}: the p2p matrix after it is not a second topo -m"
        );
        assert_eq!(m.get("GPU0", "GPU1"), Some(want), "{file}");
        assert_round_trip(&m);
    }
    let (_, m) = smi("topo-club3090-178-2x3090-sys.txt");
    assert_eq!(
        m.row("GPU0").unwrap().numa_affinity,
        None,
        "blank cell kept blank"
    );
    assert_eq!(m.row("GPU1").unwrap().numa_affinity.as_deref(), Some("1"));
}

/// The legend gdpath writes is line for line the one nvidia-smi printed.
#[test]
fn legend_matches_nvidia_smi() {
    for text in [
        smi("topo-club3090-1229-2x5090-phb-gns.txt").0,
        std::fs::read_to_string(fixture("device/h200x2-probe-2026-11-30.txt")).unwrap(),
    ] {
        let start = text.find("Legend:").unwrap();
        let printed: Vec<&str> = text[start..]
            .lines()
            .skip(2)
            .take_while(|l| l.starts_with("  ") && l.contains(" = "))
            .collect();
        assert_eq!(printed, legend_lines());
    }
}

/// The H200 VM as its probe states it: PCI functions 00:00.0..00:07.0 on pci0000:00, numa -1,
/// the GPUs 10de:2335 at 00:06.0 and 00:07.0 at 32 GT/s x16, one NUMA node with CPUs 0-31, an
/// empty /sys/class/iommu and /sys/class/infiniband.
pub fn h200_tree(root: &std::path::Path) {
    let devs = [
        ("0000:00:00.0", "0x060000", "0x8086", "0x0d57"),
        ("0000:00:01.0", "0x018000", "0x1af4", "0x1042"),
        ("0000:00:02.0", "0x018000", "0x1af4", "0x1042"),
        ("0000:00:03.0", "0x020000", "0x1af4", "0x1041"),
        ("0000:00:04.0", "0xffff00", "0x1af4", "0x1053"),
        ("0000:00:05.0", "0xffff00", "0x1af4", "0x1044"),
        ("0000:00:06.0", "0x030200", "0x10de", "0x2335"),
        ("0000:00:07.0", "0x030200", "0x10de", "0x2335"),
    ];
    for (bdf, class, vendor, device) in devs {
        let d = format!("sys/devices/pci0000:00/{bdf}");
        write(root, &format!("{d}/class"), format!("{class}\n"));
        write(root, &format!("{d}/vendor"), format!("{vendor}\n"));
        write(root, &format!("{d}/device"), format!("{device}\n"));
        write(root, &format!("{d}/numa_node"), "-1\n");
        write(root, &format!("{d}/local_cpulist"), "0-31\n");
        if vendor == "0x10de" {
            for f in ["current_link_speed", "max_link_speed"] {
                write(root, &format!("{d}/{f}"), "32.0 GT/s PCIe\n");
            }
            for f in ["current_link_width", "max_link_width"] {
                write(root, &format!("{d}/{f}"), "16\n");
            }
        }
        symlink(
            root,
            &format!("sys/bus/pci/devices/{bdf}"),
            &format!("../../../devices/pci0000:00/{bdf}"),
        );
    }
    write(root, "sys/devices/system/node/node0/cpulist", "0-31\n");
    for d in [
        "sys/class/iommu",
        "sys/kernel/iommu_groups",
        "sys/class/infiniband",
    ] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
}

/// Driver facts of the H200 machine ([`gdpath_testkit::H200_DRIVER_FACTS_JSON`]): among them
/// 18 NVLinks of 26.562 GB/s per GPU, each ending at an NVSwitch the VM does not see as a PCI
/// device.
pub fn h200_facts() -> DriverFacts {
    serde_json::from_str(gdpath_testkit::H200_DRIVER_FACTS_JSON).unwrap()
}

#[test]
fn h200_vm_matches_its_probe() {
    let probe_text =
        std::fs::read_to_string(fixture("device/h200x2-probe-2026-11-30.txt")).unwrap();
    let probe = SmiMatrix::parse(&probe_text).unwrap();
    assert_eq!(probe.ids, ["GPU0", "GPU1"]);

    let dir = tempdir();
    h200_tree(dir.path());
    let rec = Recording::new(DirView::new(dir.path()));
    let mut m = sysfs::read_machine(&rec, "sysfs-root").unwrap();
    let (g0, g1) = (dev(&m, "0000:00:06.0"), dev(&m, "0000:00:07.0"));
    assert_eq!((g0.id.as_str(), g1.id.as_str()), ("GPU0", "GPU1"));
    assert_eq!(g0.name.as_deref(), Some("NVIDIA H200"));
    assert_eq!(g0.numa, None);
    assert!((g0.link.limit_gbps().unwrap() - 63.015).abs() < 0.01);
    // Directly on the root bus of the one host bridge: PHB by PCIe...
    assert_eq!(m.classify(g0, g1), LinkClass::Phb);
    // ...and NV18 once the driver's NVLink facts are known, as nvidia-smi prints.
    m.set_driver(h200_facts());
    let (g0, g1) = (dev(&m, "0000:00:06.0"), dev(&m, "0000:00:07.0"));
    assert_eq!(m.classify(g0, g1), LinkClass::Nv(18));
    assert_eq!(m.pcie_class(g0, g1), LinkClass::Phb);
    assert_eq!(m.iommu.enabled(), Some(false));

    let ours = SmiMatrix::from_machine(&m);
    for id in &probe.ids {
        let (p, o) = (probe.row(id).unwrap(), ours.row(id).unwrap());
        for col in &probe.ids {
            assert_eq!(ours.get(id, col), probe.get(id, col), "{id}/{col}");
        }
        assert_eq!(o.cpu_affinity, p.cpu_affinity, "{id} CPU affinity");
        assert_eq!(o.numa_affinity, p.numa_affinity, "{id} NUMA affinity");
        assert_eq!(o.gpu_numa_id, p.gpu_numa_id, "{id} GPU NUMA ID");
    }

    // A snapshot carries the driver facts: the replay still says NV18, with identical JSON.
    let mut buf = Vec::new();
    snapshot::capture(&rec, &m.source, m.driver.as_ref(), &mut buf).unwrap();
    let replay = Snapshot::from_reader(&buf[..], std::path::Path::new("h200.tar.gz"))
        .unwrap()
        .machine()
        .unwrap();
    assert_replay_matches(&m, &replay);
    assert_eq!(replay.matrix().get("GPU0", "GPU1"), Some(LinkClass::Nv(18)));
}

/// The `nvidia-smi topo -m` texts read as a source: gdpath's matrix for the machine they give
/// is the matrix in the text, row for row (a row the stored copy lost is filled from the rows
/// that are there: GPU columns by symmetry, other cells `N/A`), and gdpath's own text of it
/// parses back to it.
#[test]
fn texts_as_a_source_give_back_their_matrix() {
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(fixtures().join("nvidia-smi"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.push(fixture("device/h200x2-probe-2026-11-30.txt"));
    // "N/A" and a blank cell both say unknown.
    let norm = |v: &Option<String>| v.clone().filter(|s| s != "N/A");
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        let stated = SmiMatrix::parse(&text).unwrap();
        let machine = gdpath_topo::load(&gdpath_topo::Source::SmiTopo(path.clone())).unwrap();
        let ours = SmiMatrix::from_machine(&machine);
        let what = path.file_name().unwrap().to_string_lossy();
        assert_eq!(ours.ids, stated.ids, "{what}");
        for r in &stated.rows {
            let o = ours.row(&r.id).unwrap();
            assert_eq!(o.cells, r.cells, "{what} {}", r.id);
            assert_eq!(
                norm(&o.cpu_affinity),
                norm(&r.cpu_affinity),
                "{what} {}",
                r.id
            );
            assert_eq!(
                norm(&o.numa_affinity),
                norm(&r.numa_affinity),
                "{what} {}",
                r.id
            );
            assert_eq!(
                norm(&o.gpu_numa_id),
                norm(&r.gpu_numa_id),
                "{what} {}",
                r.id
            );
        }
        for (i, id) in ours.ids.iter().enumerate() {
            if stated.row(id).is_some() {
                continue;
            }
            // A lost row: known where another row states the pair.
            for (j, other) in ours.ids.iter().enumerate() {
                let want = match stated.row(other) {
                    _ if i == j => LinkClass::X,
                    Some(r) => r.cells[i],
                    None => LinkClass::Unknown,
                };
                assert_eq!(ours.get(id, other), Some(want), "{what} {id}/{other}");
            }
        }
        let again = SmiMatrix::parse(&ours.to_text()).unwrap();
        assert_eq!(again, ours, "{what}: gdpath's text parses back");
    }
}

fn variant_of(name: &str, edits: &[(&str, &str)]) -> String {
    let mut t = std::fs::read_to_string(fixture(&format!("nvidia-smi/{name}"))).unwrap();
    for (from, to) in edits {
        assert!(t.contains(from), "{name} has no {from:?}");
        t = t.replace(from, to);
    }
    t
}

/// The formats of other versions and of copies, each derived in the test from a vendored text:
/// spaces for tabs, no NUMA columns (drivers before R450), NICs named in the header and `SOC`
/// for `SYS` (before R384), a NIC Legend.
#[test]
fn formats_of_other_versions() {
    // Spaces instead of tabs: the same matrix.
    let tabs = smi("topo-club3090-1229-2x5090-phb-gns.txt").1;
    let spaced = SmiMatrix::parse(&variant_of(
        "topo-club3090-1229-2x5090-phb-gns.txt",
        &[("\t", "    ")],
    ))
    .unwrap();
    assert_eq!(spaced, tabs);

    // No NUMA Affinity or GPU NUMA ID column.
    let old = variant_of(
        "topo-nccl-1617-4xh100-nv6-4nic.txt",
        &[
            (
                "CPU Affinity    NUMA Affinity   GPU NUMA ID",
                "CPU Affinity",
            ),
            ("6,14,22,30      3               N/A", "6,14,22,30"),
            ("4,12,20,28      1               N/A", "4,12,20,28"),
            ("7,15,23,31      7               N/A", "7,15,23,31"),
            ("5,13,21,29      5               N/A", "5,13,21,29"),
        ],
    );
    let m = SmiMatrix::parse(&old).unwrap();
    assert!(m.columns.cpu_affinity && !m.columns.numa_affinity && !m.columns.gpu_numa_id);
    let g2 = m.row("GPU2").unwrap();
    assert_eq!(g2.cpu_affinity.as_deref(), Some("7,15,23,31"));
    assert_eq!(
        (g2.numa_affinity.as_deref(), g2.gpu_numa_id.as_deref()),
        (None, None)
    );
    let machine = m.to_machine();
    assert!(machine.coverage.numa.is_unknown());
    assert_eq!(machine.by_id("GPU2").unwrap().numa, None);
    assert_eq!(SmiMatrix::parse(&m.to_text()).unwrap(), m);

    // NICs named by their RDMA device in the header and rows, SOC for SYS.
    let named = variant_of(
        "topo-nccl-1617-4xh100-nv6-4nic.txt",
        &[
            ("NIC0", "mlx5_0"),
            ("NIC1", "mlx5_1"),
            ("NIC2", "mlx5_2"),
            ("NIC3", "mlx5_3"),
            ("SYS", "SOC"),
        ],
    );
    let m = SmiMatrix::parse(&named).unwrap();
    assert_eq!(m.ids[4..], ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]);
    assert_eq!(m.get("GPU2", "mlx5_0"), Some(LinkClass::Sys));
    assert_eq!(m.get("mlx5_3", "GPU3"), Some(LinkClass::Pix));
    let machine = m.to_machine();
    let nic = machine.by_id("NIC0").unwrap();
    assert_eq!(nic.rdma, ["mlx5_0"]);
    assert!(machine.coverage.rdma.is_described());
    assert_eq!(
        machine.classify(machine.by_id("GPU0").unwrap(), nic),
        LinkClass::Pix
    );

    // A NIC Legend names the NICs of current versions.
    let legend = format!(
        "{}\nNIC Legend:\n\n  NIC0: mlx5_0\n  NIC1: mlx5_1\n  NIC2: mlx5_2\n  NIC3: mlx5_3\n",
        variant_of("topo-nccl-1617-4xh100-nv6-4nic.txt", &[])
    );
    let m = SmiMatrix::parse(&legend).unwrap();
    assert_eq!(m.nic_legend.len(), 4);
    let machine = m.to_machine();
    assert_eq!(machine.by_id("NIC2").unwrap().rdma, ["mlx5_2"]);
    assert!(machine.coverage.rdma.is_described());
    assert_eq!(SmiMatrix::from_machine(&machine).nic_legend, m.nic_legend);
}

#[test]
fn text_that_is_not_a_matrix() {
    use gdpath_topo::smi::SmiError;
    assert_eq!(SmiMatrix::parse("hello\n"), Err(SmiError::NoHeader));
    let err = SmiMatrix::parse("\tGPU0\tGPU1\tCPU Affinity\nGPU0\t X \tPCI\t0-3\n").unwrap_err();
    assert!(matches!(err, SmiError::BadRow { line: 2, .. }), "{err}");
    let err = SmiMatrix::parse("\tGPU0\tGPU1\nGPU0\t X \n").unwrap_err();
    assert!(matches!(err, SmiError::BadRow { line: 2, .. }), "{err}");
}
