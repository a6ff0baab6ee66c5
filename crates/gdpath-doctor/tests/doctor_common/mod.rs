//! Helpers shared by the doctor tests: fixtures, derived trees, the H200 machine.
#![allow(dead_code, unused_imports)]

use gdpath::topo::facts::DriverFacts;
use gdpath::topo::Source;
use gdpath::{Finding, Status};
use gdpath_doctor::{self as doctor, DoctorInput, Mode, Report};
pub use gdpath_testkit::{fixture, fixtures, scratch, symlink, unpack_sysfs, write};
use std::path::{Path, PathBuf};

pub const SANDY: &str = "hwloc-sysfs-32em64t-2n8c+dax+nvme+mic+dimms.tar.bz2";
pub const QEMU: &str = "hwloc-sysfs-2pa-pcidomain32bits.tar.bz2";
pub const POWER9: &str = "hwloc-sysfs-nvidiagpunumanodes.tar.bz2";

pub fn mkdir(root: &Path, rel: &str) {
    std::fs::create_dir_all(root.join(rel)).unwrap();
}

/// Runs the doctor on a sysfs tree (replay mode unless `setup` changes it).
pub fn doctor_on(root: &Path, setup: impl FnOnce(&mut DoctorInput)) -> Report {
    let loaded = doctor::load(&Source::SysfsRoot(root.to_owned())).unwrap();
    let mut input = DoctorInput::new(&loaded.machine, loaded.view.as_ref(), loaded.mode.clone());
    setup(&mut input);
    doctor::run(&input)
}

/// The doctor on any source, as a replay.
pub fn doctor_on_source(source: Source) -> Report {
    let loaded = doctor::load(&source).unwrap();
    let input = DoctorInput::new(&loaded.machine, loaded.view.as_ref(), loaded.mode.clone());
    doctor::run(&input)
}

/// As [`doctor_on`], with the machine changed by `change` before the doctor runs.
pub fn doctor_on_machine(
    root: &Path,
    change: impl FnOnce(&mut gdpath::topo::Machine),
    setup: impl FnOnce(&mut DoctorInput),
) -> Report {
    let loaded = doctor::load(&Source::SysfsRoot(root.to_owned())).unwrap();
    let mut machine = loaded.machine;
    change(&mut machine);
    let mut input = DoctorInput::new(&machine, loaded.view.as_ref(), loaded.mode.clone());
    setup(&mut input);
    doctor::run(&input)
}

/// Derived: driver facts that list the machine's GPUs (by PCI address, in PCI order) with no
/// NVLink, as NVML reports GPUs without NVLink: the source then describes NVLink, and none
/// joins the GPUs.
pub fn no_nvlink(m: &mut gdpath::topo::Machine) {
    let gpus = m
        .gpus()
        .enumerate()
        .map(|(i, g)| gdpath::topo::facts::GpuFacts {
            ordinal: i as u32,
            pci: g.pci.to_string(),
            name: g.display_name(),
            ..Default::default()
        })
        .collect();
    m.set_driver(DriverFacts {
        gpus,
        ..Default::default()
    });
    assert!(m.coverage.nvlink.is_described());
}

/// The one finding with this id and subject; panics listing what there is.
pub fn find<'a>(r: &'a Report, id: &str, subject: &str) -> &'a Finding {
    let mut hits: Vec<&Finding> = r
        .findings
        .iter()
        .filter(|f| f.id.as_str() == id && f.subject == subject)
        .collect();
    // system.no-gpu is repeated under GDR and GDS; by default take the one of the id's own path.
    if hits.len() > 1 {
        hits.retain(|f| id.starts_with(&format!("{}.", area_name(f.path))));
    }
    assert_eq!(
        hits.len(),
        1,
        "expected one {id} for {subject:?}; findings:\n{}",
        r.findings
            .iter()
            .map(|f| format!("  {} {:?} {:?}: {}", f.id, f.subject, f.status, f.evidence))
            .collect::<Vec<_>>()
            .join("\n")
    );
    hits[0]
}

fn area_name(a: gdpath::Area) -> &'static str {
    match a {
        gdpath::Area::P2p => "p2p",
        gdpath::Area::Gdr => "gdr",
        gdpath::Area::Gds => "gds",
        gdpath::Area::Storage => "storage",
        gdpath::Area::System => "system",
    }
}

pub fn status(r: &Report, id: &str, subject: &str) -> Status {
    find(r, id, subject).status
}

/// A config space of 4 KiB whose extended capability list holds one ACS capability at 0x100
/// with every capability bit and the control bits `control` (RR = 0x4, CR = 0x8), after the
/// original 64-byte header (`header`).
pub fn config_with_acs(header: &[u8], control: u16) -> Vec<u8> {
    let mut cfg = vec![0u8; 4096];
    cfg[..header.len().min(256)].copy_from_slice(&header[..header.len().min(256)]);
    let put =
        |cfg: &mut [u8], off: usize, v: u32| cfg[off..off + 4].copy_from_slice(&v.to_le_bytes());
    put(&mut cfg, 0x100, 0x000d | (1 << 16));
    put(&mut cfg, 0x104, 0x007f | (u32::from(control) << 16));
    cfg
}

/// Derives "two GPUs" from the Sandy Bridge dump: the Xeon Phi at 0000:83:00.0 (under root port
/// 80:03.0, socket 1, beside the ConnectX-3 at 82:00.0) and the on-board VGA at 0000:05:00.0
/// (socket 0) become NVIDIA 3D controllers (class 0x030200, vendor 0x10de). Only their class
/// and vendor files change; the tree, NUMA nodes and every other device are the real ones.
pub fn sandy_with_gpus(top: &Path, both: bool) {
    let mut devs = vec!["0000:83:00.0"];
    if both {
        devs.push("0000:05:00.0");
    }
    for d in devs {
        let dir = std::fs::canonicalize(top.join(format!("sys/bus/pci/devices/{d}"))).unwrap();
        let rel = dir
            .strip_prefix(std::fs::canonicalize(top).unwrap())
            .unwrap()
            .to_owned();
        let rel = rel.to_str().unwrap();
        write(top, &format!("{rel}/class"), "0x030200\n");
        write(top, &format!("{rel}/vendor"), "0x10de\n");
    }
}

/// The H200 probe text.
pub fn h200_probe() -> String {
    std::fs::read_to_string(fixture("device/h200x2-probe-2026-11-30.txt")).unwrap()
}

/// A sysfs tree built from what the H200 probe printed: each `/sys/bus/pci/devices/…` line
/// (class, vendor:device, numa, link and max link, canonical path), `/sys/class/infiniband`
/// empty, `/sys/class/iommu` and `/sys/kernel/iommu_groups` empty, the modules the probe's
/// grep found (ib_core, nvidia, nvidia_uvm; no nvidia_fs, no nvidia_peermem), NUMA node 0 with
/// CPUs 0-31 (`topo -m` CPU affinity), and the kernel release from `uname -a`. Nothing else.
pub fn h200_tree() -> tempfile::TempDir {
    let probe = h200_probe();
    let tmp = scratch();
    let root = tmp.path();
    let mut n = 0;
    for l in probe
        .lines()
        .filter(|l| l.starts_with("/sys/bus/pci/devices/"))
    {
        let (lhs, canon) = l.split_once(" -> ").unwrap();
        let mut w = lhs.splitn(4, ' ');
        let bus_path = w.next().unwrap();
        let class = w.next().unwrap();
        let (ven, dev) = w.next().unwrap().split_once(':').unwrap();
        let rest = w.next().unwrap();
        let numa = rest
            .split_whitespace()
            .next()
            .unwrap()
            .trim_start_matches("numa=");
        let link = rest.split(" link=").nth(1).unwrap();
        let (cur, max) = link.split_once(" max=").unwrap();
        let split = |s: &str| -> (String, String) {
            let (sp, wd) = s.rsplit_once("/x").unwrap();
            (sp.to_owned(), wd.to_owned())
        };
        let (cs, cw) = split(cur);
        let (ms, mw) = split(max);
        let dir = canon.trim_start_matches('/');
        write(root, &format!("{dir}/class"), format!("{class}\n"));
        write(root, &format!("{dir}/vendor"), format!("{ven}\n"));
        write(root, &format!("{dir}/device"), format!("{dev}\n"));
        write(root, &format!("{dir}/numa_node"), format!("{numa}\n"));
        for (f, v) in [
            ("current_link_speed", cs),
            ("current_link_width", cw),
            ("max_link_speed", ms),
            ("max_link_width", mw),
        ] {
            if !v.is_empty() {
                write(root, &format!("{dir}/{f}"), format!("{v}\n"));
            }
        }
        let bdf = bus_path.rsplit('/').next().unwrap();
        symlink(
            root,
            &format!("sys/bus/pci/devices/{bdf}"),
            &format!("../../../devices/pci0000:00/{bdf}"),
        );
        n += 1;
    }
    assert_eq!(n, 8, "the probe lists 8 PCI functions");
    for d in [
        "sys/class/infiniband",
        "sys/class/iommu",
        "sys/kernel/iommu_groups",
    ] {
        mkdir(root, d);
    }
    for m in ["ib_core", "nvidia", "nvidia_uvm"] {
        mkdir(root, &format!("sys/module/{m}"));
    }
    write(root, "sys/devices/system/node/node0/cpulist", "0-31\n");
    let uname = probe.lines().find(|l| l.starts_with("Linux vm ")).unwrap();
    write(
        root,
        "proc/sys/kernel/osrelease",
        format!("{}\n", uname.split_whitespace().nth(2).unwrap()),
    );
    tmp
}

/// Driver facts of the H200 machine as its probe shows them
/// ([`gdpath_testkit::H200_DRIVER_FACTS_JSON`]).
pub fn h200_facts() -> DriverFacts {
    serde_json::from_str(gdpath_testkit::H200_DRIVER_FACTS_JSON).unwrap()
}

/// Runs the doctor on the H200 tree with its driver facts attached to the machine (as the
/// engine does live), in live mode; `setup` adds what a test needs.
pub fn doctor_h200(facts: DriverFacts, setup: impl FnOnce(&mut DoctorInput)) -> Report {
    let tmp = h200_tree();
    let loaded = doctor::load(&Source::SysfsRoot(tmp.path().to_owned())).unwrap();
    let mut machine = loaded.machine;
    machine.set_driver(facts);
    let mut input = DoctorInput::new(&machine, loaded.view.as_ref(), Mode::Live);
    setup(&mut input);
    doctor::run(&input)
}
