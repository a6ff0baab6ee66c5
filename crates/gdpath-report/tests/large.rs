//! The drawing of cloud-sized machines: 8 GPUs, 32 NICs and 9 NVMe drives, derived here from
//! the p4d.24xlarge's published topology (its four PCIe switches, two GPUs each, given eight
//! EFA NICs and two NVMe drives each, as a p5.48xlarge has; one more NVMe on the first host
//! bridge) and, second, the same devices each on a PCIe host bridge of its own, as Hyper-V
//! presents a VM's devices. Both must show every device with no label over another, and stay
//! within a width a screen can show with some scrolling.

mod common;
use common::*;
use gdpath_doctor::{DoctorInput, Mode, NoFiles};
use gdpath_report::results::Figures;
use gdpath_testkit::fixture;
use gdpath_topo::{Device, DeviceKind, Machine, PciAddr, PcieLink, Source};

fn p4d() -> Machine {
    gdpath_topo::load(&Source::NcclXml(fixture(
        "nccl-xml/nccl-aws-p4d-24xl-topo.xml",
    )))
    .unwrap()
}

fn endpoint(pci: PciAddr, kind: DeviceKind, like: &Device) -> Device {
    let mut d = Device::new(pci);
    d.kind = kind;
    (d.class, d.vendor, d.device, d.name) = match kind {
        DeviceKind::Nic => (0x020000, 0x1d0f, 0xefa1, Some("Amazon EFA".to_owned())),
        _ => (0x010802, 0x144d, 0xa808, Some("Samsung NVMe".to_owned())),
    };
    d.numa = like.numa;
    d.cpus = like.cpus.clone();
    d.host_bridge = like.host_bridge.clone();
    d.link = PcieLink {
        cur_gts: Some(16.0),
        cur_width: Some(if kind == DeviceKind::Nic { 16 } else { 4 }),
        max_gts: Some(16.0),
        max_width: Some(if kind == DeviceKind::Nic { 16 } else { 4 }),
        ..PcieLink::default()
    };
    d
}

/// 8 GPUs (the p4d's), 32 NICs (8 under each switch), 9 NVMe (2 per switch, 1 on cpu0).
fn cloud_machine() -> Machine {
    let base = p4d();
    let mut devs: Vec<Device> = base
        .devices
        .iter()
        .filter(|d| d.kind != DeviceKind::Nic)
        .cloned()
        .collect();
    let switches: Vec<Device> = base
        .devices
        .iter()
        .filter(|d| d.kind == DeviceKind::Bridge)
        .cloned()
        .collect();
    assert_eq!(switches.len(), 4);
    for (s, sw) in switches.iter().enumerate() {
        for i in 0..10u8 {
            let kind = if i < 8 {
                DeviceKind::Nic
            } else {
                DeviceKind::Nvme
            };
            let pci = PciAddr {
                domain: 0,
                bus: 0x30 + s as u8,
                device: i,
                function: 0,
            };
            let mut d = endpoint(pci, kind, sw);
            d.parent = Some(sw.pci);
            devs.push(d);
        }
    }
    let first = &switches[0];
    let mut root_nvme = endpoint(
        PciAddr {
            domain: 0,
            bus: 0x01,
            device: 0,
            function: 0,
        },
        DeviceKind::Nvme,
        first,
    );
    root_nvme.parent = None;
    devs.push(root_nvme);
    nvswitched(devs, &base)
}

/// `devs` on the NUMA nodes and IOMMU of `like`, as NCCL's XML describes them, with the p4d's
/// A100s joined all to all through NVSwitches, 12 links a pair.
fn nvswitched(devs: Vec<Device>, like: &Machine) -> Machine {
    let mut m = Machine::assemble(
        devs,
        like.numa_nodes.clone(),
        like.iommu.clone(),
        true,
        "nccl-xml",
    );
    let gpus: Vec<PciAddr> = m.gpus().map(|g| g.pci).collect();
    for (i, a) in gpus.iter().enumerate() {
        for b in &gpus[i + 1..] {
            m.set_nvlink(*a, *b, 12);
        }
    }
    m
}

/// The same devices, each on a host bridge (PCI domain) of its own, half on each NUMA node.
fn one_bridge_each(m: &Machine) -> Machine {
    let shown: Vec<Device> = m
        .devices
        .iter()
        .filter(|d| matches!(d.kind, DeviceKind::Gpu | DeviceKind::Nic | DeviceKind::Nvme))
        .cloned()
        .collect();
    let n = shown.len();
    let devs = shown
        .into_iter()
        .enumerate()
        .map(|(i, mut d)| {
            d.pci = PciAddr {
                domain: 1 + i as u32,
                bus: 0,
                device: 0,
                function: 0,
            };
            d.parent = None;
            d.host_bridge = Some(format!("pci{:04x}:00", 1 + i));
            d.numa = Some(u32::from(i >= n / 2));
            d
        })
        .collect();
    Machine::assemble(
        devs,
        m.numa_nodes.clone(),
        m.iommu.clone(),
        true,
        "sysfs-root",
    )
}

fn svg_of(m: &Machine) -> String {
    let input = DoctorInput::new(
        m,
        &NoFiles,
        Mode::Replay {
            what: "a machine made by the test".into(),
        },
    );
    let report = gdpath_doctor::run(&input);
    let routes = gdpath_doctor::routes::routes(m, &NoFiles, &[], &report);
    let none = Figures::default();
    gdpath_report::drawing::machine_svg(m, &routes, &none, &none)
}

fn check(m: &Machine, what: &str, max_width: f64) {
    assert_eq!(
        (m.gpus().count(), m.nics().count(), m.nvmes().count()),
        (8, 32, 9)
    );
    let svg = svg_of(m);
    // To look at them: GDPATH_REPORT_DUMP=DIR keeps the drawings there.
    if let Some(dir) = std::env::var_os("GDPATH_REPORT_DUMP") {
        std::fs::write(std::path::Path::new(&dir).join(format!("{what}.svg")), &svg).unwrap();
    }
    let doc = parse(&svg);
    let root = doc.root_element();
    assert_devices_drawn(root, m, what);
    assert_no_overlap(root, what);
    assert_lines_clear(root, what);
    let w: f64 = root.attribute("width").unwrap().parse().unwrap();
    assert!(w <= max_width, "{what}: {w} px wide");
    // One GDR path per GPU, one GDS path per GPU.
    for area in ["gdr", "gds"] {
        let n = root
            .descendants()
            .filter(|x| {
                x.attribute("data-route")
                    .is_some_and(|r| r.starts_with(&format!("{area} ")))
            })
            .count();
        assert_eq!(n, 8, "{what}: {area} paths");
    }
}

#[test]
fn eight_gpus_thirty_two_nics_nine_nvme_under_switches() {
    let m = cloud_machine();
    check(&m, "switches", 2400.0);
    // NVLink to every pair drawn once, as one fabric bar, not 28 lines.
    let svg = svg_of(&m);
    assert!(svg.contains("NV12: 12 NVLinks between every pair of these 8 GPUs"));
    assert_eq!(svg.matches("class=\"nvlink\"").count(), 1);
}

#[test]
fn the_same_devices_each_on_a_host_bridge_of_its_own() {
    let m = one_bridge_each(&cloud_machine());
    check(&m, "one host bridge each", 2400.0);
    // The NIC/NVMe-only host bridges are merged into stacks whose rows name them: boxes only
    // for the GPUs' eight.
    let svg = svg_of(&m);
    assert_eq!(svg.matches(">host bridge</text>").count(), 8);
    assert!(
        svg.contains(">pci0009:00</text>"),
        "merged rows name their host bridge"
    );
}

/// NVLink as a hybrid cube mesh (the pattern of the DGX-1: each GPU with four peers, one or two
/// links each), on the 8-GPU machine: not all to all, so each connection is a bracket in the
/// band, on levels so that no two labels meet.
#[test]
fn a_hybrid_cube_mesh_of_nvlinks() {
    let mut m = cloud_machine();
    let gpus: Vec<PciAddr> = m.gpus().map(|g| g.pci).collect();
    for (i, a) in gpus.iter().enumerate() {
        for b in &gpus[i + 1..] {
            m.set_nvlink(*a, *b, 0);
        }
    }
    const MESH: [(usize, usize, u32); 16] = [
        (0, 1, 1),
        (0, 2, 1),
        (0, 3, 2),
        (0, 4, 2),
        (1, 2, 2),
        (1, 3, 1),
        (1, 5, 2),
        (2, 3, 2),
        (2, 6, 1),
        (3, 7, 1),
        (4, 5, 1),
        (4, 6, 1),
        (4, 7, 2),
        (5, 6, 2),
        (5, 7, 1),
        (6, 7, 2),
    ];
    for (a, b, n) in MESH {
        m.set_nvlink(gpus[a], gpus[b], n);
    }
    let svg = svg_of(&m);
    if let Some(dir) = std::env::var_os("GDPATH_REPORT_DUMP") {
        std::fs::write(std::path::Path::new(&dir).join("mesh.svg"), &svg).unwrap();
    }
    let doc = parse(&svg);
    assert_no_overlap(doc.root_element(), "hybrid cube mesh");
    assert_lines_clear(doc.root_element(), "hybrid cube mesh");
    let drawn = doc
        .descendants()
        .filter(|n| n.attribute("class") == Some("nvlink"))
        .count();
    assert_eq!(drawn, 16, "one bracket per connection");
    for (a, b, _) in MESH {
        let pair = format!("GPU{a} GPU{b}");
        assert!(
            doc.descendants()
                .any(|n| n.attribute("data-gpus") == Some(pair.as_str())),
            "{pair}"
        );
    }
}

/// The 8-GPU machine with its NICs on the second socket only (as in a cloud VM whose NICs all
/// hang off one CPU): the four GPUs of the first socket reach them across the CPU
/// interconnect, staged through host memory. Their dashed paths share one way into each
/// node's host memory and one lane across, not one each; no line runs over a label.
#[test]
fn staged_paths_across_the_sockets_share_one_lane() {
    let all = cloud_machine();
    let devs: Vec<Device> = all
        .devices
        .iter()
        .filter(|d| d.kind != DeviceKind::Nic || d.numa == Some(1))
        .cloned()
        .collect();
    let m = nvswitched(devs, &all);
    assert_eq!(m.nics().count(), 16);
    let svg = svg_of(&m);
    if let Some(dir) = std::env::var_os("GDPATH_REPORT_DUMP") {
        std::fs::write(std::path::Path::new(&dir).join("cross.svg"), &svg).unwrap();
    }
    let doc = parse(&svg);
    let root = doc.root_element();
    assert_no_overlap(root, "NICs on one socket");
    assert_lines_clear(root, "NICs on one socket");
    let staged: Vec<_> = root
        .descendants()
        .filter(|n| {
            n.attribute("class") == Some("route gdr staged") && n.has_attribute("data-route")
        })
        .collect();
    assert_eq!(staged.len(), 4, "GPU0–3 staged across the sockets");
    // Above the nodes' boxes the paths run along the interconnect: one stroke for all four.
    let numa_top = root
        .descendants()
        .filter(|n| n.attribute("class") == Some("numa-box"))
        .map(|n| n.attribute("y").unwrap().parse::<f64>().unwrap())
        .fold(f64::MAX, f64::min);
    let across: Vec<f64> = staged
        .iter()
        .filter(|p| p.attribute("stroke-opacity") != Some("0"))
        .flat_map(|p| segments(p.attribute("d").unwrap()))
        .filter(|(a, b)| a.1 < numa_top && (a.1 - b.1).abs() < 0.01)
        .map(|(a, _)| a.1)
        .collect();
    assert_eq!(
        across.len(),
        1,
        "one stroke along the interconnect: {across:?}"
    );
}

/// More NVLink connections that are not all to all than can be placed as brackets (a ring of
/// 100 GPUs: 100 of them): none is drawn and a note says so and why, where before each bracket
/// was placed clear of every other (their square) and a label searched for among them all.
/// The GPUs' pairs are counted by class, past the doctor's 64 GPUs.
#[test]
fn a_ring_of_nvlinks_too_large_for_brackets() {
    let devs: Vec<Device> = (0..100u32)
        .map(|i| {
            let mut d = Device::new(PciAddr {
                domain: 0,
                bus: 1 + (i / 32) as u8,
                device: (i % 32) as u8,
                function: 0,
            });
            d.kind = DeviceKind::Gpu;
            d.class = 0x030200;
            d.vendor = 0x10de;
            d.device = 0x2330;
            d.numa = Some(0);
            d.host_bridge = Some("pci0000:00".into());
            d
        })
        .collect();
    let mut m = Machine::assemble(
        devs,
        Vec::new(),
        gdpath_topo::IommuState::default(),
        true,
        "sysfs-root",
    );
    let gpus: Vec<PciAddr> = m.gpus().map(|g| g.pci).collect();
    for i in 0..gpus.len() {
        m.set_nvlink(gpus[i], gpus[(i + 1) % gpus.len()], 2);
    }
    let t = std::time::Instant::now();
    let svg = svg_of(&m);
    assert!(t.elapsed().as_secs() < 30, "{:?}", t.elapsed());
    assert!(
        svg.contains("NVLink: 100 connections that are not all to all, more than the 64 drawn"),
        "no note on the undrawn NVLinks"
    );
    assert_eq!(svg.matches("class=\"nvlink\"").count(), 0);
    assert!(svg.contains("100 GPUs, more than the 64 whose pairs are drawn cell by cell"));
    // 100 of the 4,950 pairs are NV2, the others PHB.
    assert!(svg.contains("NV2   100 pairs") && svg.contains("PHB   4850 pairs"));
    assert!(!svg.contains("class=\"mx-cell\""));
}
