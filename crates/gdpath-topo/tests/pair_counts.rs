//! `Machine::pair_counts` (what the documents print in place of the matrix past
//! `input::MAX_LISTED_PAIR_DEVICES` devices) counts the pairs the matrix lists, class by class:
//! on every vendored source, with and without NVLink, and on machines large enough that only the
//! counts are printed.

mod common;
use common::*;
use gdpath_topo::{input, load, Device, LinkClass, Machine, PairCounts, Source};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The pairs of the matrix, each once (above the diagonal), counted per class.
fn tally(m: &Machine) -> BTreeMap<LinkClass, u64> {
    let mx = m.matrix();
    let mut out = BTreeMap::new();
    for (i, row) in mx.cells.iter().enumerate() {
        for c in &row[i + 1..] {
            *out.entry(*c).or_insert(0) += 1;
        }
    }
    out
}

fn counts(m: &Machine) -> PairCounts {
    m.pair_counts(&m.matrix_devices())
}

fn assert_counts_match(m: &Machine, what: &str) {
    let c = counts(m);
    let want = tally(m);
    assert_eq!(c.classes, want, "{what}");
    assert_eq!(c.pairs, want.values().sum::<u64>(), "{what}");
    assert_eq!(c.devices, m.matrix_devices().len(), "{what}");
}

/// Every vendored source: the NCCL and hwloc XML, the nvidia-smi texts (classes stated pair by
/// pair), the sysfs dumps and the H200 capture (driver NVLink).
#[test]
fn counts_are_the_matrix_on_every_fixture() {
    let mut sources = Vec::new();
    for (dir, ext, make) in [
        ("nccl-xml", ".xml", Source::NcclXml as fn(_) -> Source),
        ("hwloc-xml", ".xml", Source::HwlocXml),
        ("nvidia-smi", ".txt", Source::SmiTopo),
    ] {
        for e in std::fs::read_dir(fixtures().join(dir)).unwrap() {
            let p = e.unwrap().path();
            if p.to_str().unwrap().ends_with(ext) {
                sources.push(make(p));
            }
        }
    }
    sources.push(Source::Snapshot(fixture(
        "device/h200x1-capture-2026-12-01.tar.gz",
    )));
    assert!(sources.len() >= 14, "{}", sources.len());
    for s in &sources {
        let m = load(s).unwrap();
        assert_counts_match(&m, &s.describe());
    }
    for name in [
        "hwloc-sysfs-2pa-pcidomain32bits",
        "hwloc-sysfs-32em64t-2n8c+dax+nvme+mic+dimms",
        "hwloc-sysfs-40intel64-2g2n4c+pcilocality",
        "hwloc-sysfs-nvidiagpunumanodes",
    ] {
        let (_tmp, top) = unpack_sysfs(&format!("{name}.tar.bz2"));
        let m = load(&Source::SysfsRoot(top)).unwrap();
        assert_counts_match(&m, name);
    }
}

/// The p4d file with NVLink added: all to all through NVSwitches, then a few pairs only (NV#
/// moves those pairs out of their PCIe class, and only those).
#[test]
fn nvlink_bonds_move_pairs_to_nv() {
    let mut m = load(&Source::NcclXml(fixture(
        "nccl-xml/nccl-aws-p4d-24xl-topo.xml",
    )))
    .unwrap();
    let gpus: Vec<_> = m.gpus().map(|g| g.pci).collect();
    assert_eq!(gpus.len(), 8);
    for (i, a) in gpus.iter().enumerate() {
        for b in &gpus[i + 1..] {
            m.set_nvlink(*a, *b, 12);
        }
    }
    assert_counts_match(&m, "p4d, NV12 all to all");
    assert_eq!(counts(&m).classes[&LinkClass::Nv(12)], 28);
    for b in &gpus[2..] {
        m.set_nvlink(gpus[0], *b, 0);
    }
    m.set_nvlink(gpus[1], gpus[2], 4);
    assert_counts_match(&m, "p4d, some pairs");
    // The GPUs alone, as the report counts them.
    let gpu_devs: Vec<&Device> = m.gpus().collect();
    let c = m.pair_counts(&gpu_devs);
    assert_eq!(c.pairs, 28);
    assert_eq!(c.classes[&LinkClass::Nv(4)], 1);
}

/// NCCL XML of `n` GPUs under `switches` virtual switches spread over two CPUs, each GPU with
/// an `<nvlink>` to an NVSwitch when `nvswitch`.
fn switched_nccl(n: usize, switches: usize, nvswitch: bool) -> String {
    let mut s = String::from("<system version=\"1\">\n");
    for cpu in 0..2 {
        s.push_str(&format!(
            "<cpu numaid=\"{cpu}\" affinity=\"{}\">\n",
            if cpu == 0 { "ff" } else { "ff00" }
        ));
        for sw in (0..switches).filter(|k| k % 2 == cpu) {
            s.push_str(&format!(
                "<pci busid=\"ffff:ff:{:02x}.{}\" class=\"0x060400\">\n",
                sw / 8,
                sw % 8
            ));
            for i in (0..n).filter(|i| i % switches == sw) {
                let link = if nvswitch {
                    "<nvlink target=\"ffff:fe:00.0\" count=\"18\" tclass=\"0x068000\"/>"
                } else {
                    ""
                };
                s.push_str(&format!(
                    "<pci busid=\"{:04x}:{:02x}:00.0\" class=\"0x030200\" vendor=\"0x10de\" \
                     device=\"0x2330\"><gpu dev=\"{i}\">{link}</gpu></pci>\n",
                    i / 256 + 1,
                    i % 256
                ));
            }
            s.push_str("</pci>\n");
        }
        s.push_str("</cpu>\n");
    }
    s.push_str("</system>\n");
    s
}

/// Machines of a few hundred GPUs under switches on two CPUs, within the listing limit (so the
/// matrix can be compared) and past it (where only the counts are made, in bounded time).
#[test]
fn counts_of_large_machines() {
    let dir = tempdir();
    for (n, switches, nv) in [(120, 7, false), (200, 16, true), (250, 1, false)] {
        let p = dir.path().join(format!("{n}.xml"));
        std::fs::write(&p, switched_nccl(n, switches, nv)).unwrap();
        let m = load(&Source::NcclXml(p)).unwrap();
        assert_eq!(m.gpus().count(), n);
        assert_counts_match(&m, &format!("{n} GPUs under {switches} switches"));
        if nv {
            assert_eq!(
                counts(&m).classes[&LinkClass::Nv(18)],
                (n * (n - 1) / 2) as u64
            );
        }
    }
    // 4,000 GPUs under 40 switches: counted, not listed.
    let p = dir.path().join("4000.xml");
    std::fs::write(&p, switched_nccl(4000, 40, false)).unwrap();
    let m = load(&Source::NcclXml(p)).unwrap();
    let t = Instant::now();
    let s = m.pair_summary().expect("past the listing limit");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert_eq!(s.limit, input::MAX_LISTED_PAIR_DEVICES);
    assert_eq!(s.counts.pairs, 4000 * 3999 / 2);
    // 100 GPUs a switch: PIX within one; PHB between switches of a CPU (20 of them); SYS across.
    let c = &s.counts.classes;
    assert_eq!(c[&LinkClass::Pix], 40 * 100 * 99 / 2);
    assert_eq!(c[&LinkClass::Phb], 2 * (20 * 19 / 2) * 100 * 100);
    assert_eq!(c[&LinkClass::Sys], 2000 * 2000);
    let doc = serde_json::to_value(m.report()).unwrap();
    assert!(doc.get("matrix").is_none());
    assert_eq!(doc["pair_classes"]["classes"]["SYS"], 4_000_000);
}
