//! The snapshot `gdpath topo capture` took on the real two-GPU H200 machine (nvidia-h200-x2,
//! 2026-11-30, shipped as `assets/snapshots/h200x2.tar.gz`): its replay must give what
//! `nvidia-smi topo -m` printed on that machine (the probe fixture), and the doctor's verdicts
//! that the live run gave there, for the checks that do not need live hardware.

use gdpath::topo::{smi::SmiMatrix, LinkClass, Source};
use gdpath::{Area, Status};
use gdpath_doctor::{self as doctor, DoctorInput};
use gdpath_testkit::fixtures;
use std::path::PathBuf;

fn snapshot() -> PathBuf {
    PathBuf::from(gdpath_testkit::h200x2_snapshot())
}

#[test]
fn replay_matches_nvidia_smi_on_that_machine() {
    let m = gdpath_doctor::machine::load(&Source::Snapshot(snapshot())).expect("snapshot loads");
    assert_eq!(m.gpus().count(), 2);
    let driver = m.driver.as_ref().expect("the capture stored driver facts");
    assert_eq!(driver.driver_version.as_deref(), Some("580.159.04"));
    assert_eq!(driver.gpus[0].nvlinks.len(), 18);
    assert_eq!(driver.gpus[0].bar1_total_bytes, Some(256 << 30));

    let probe_path = fixtures().join("device/h200x2-probe-2026-11-30.txt");
    let probe_text = std::fs::read_to_string(&probe_path)
        .unwrap_or_else(|e| panic!("fixture {}: {e}", probe_path.display()));
    let probe = SmiMatrix::parse(&probe_text).unwrap();
    let ours = SmiMatrix::from_machine(&m);
    for row in &probe.ids {
        for col in &probe.ids {
            assert_eq!(ours.get(row, col), probe.get(row, col), "{row}/{col}");
        }
        let (p, o) = (probe.row(row).unwrap(), ours.row(row).unwrap());
        assert_eq!(o.cpu_affinity, p.cpu_affinity, "{row} CPU affinity");
        assert_eq!(o.numa_affinity, p.numa_affinity, "{row} NUMA affinity");
    }
    assert_eq!(ours.get("GPU0", "GPU1"), Some(LinkClass::Nv(18)));
    for g in m.gpus() {
        assert_eq!(g.link.cur_gen(), Some(5), "{} PCIe generation", g.id);
        assert_eq!(g.link.cur_width, Some(16), "{} PCIe width", g.id);
    }
}

#[test]
fn doctor_replay_gives_the_live_verdicts() {
    let loaded = doctor::load(&Source::Snapshot(snapshot())).unwrap();
    let input = DoctorInput::new(&loaded.machine, loaded.view.as_ref(), loaded.mode.clone());
    let r = doctor::run(&input);
    // As the live doctor said there (docs/machines.md): P2P over NVLink available, no RDMA
    // device, no nvidia-fs.
    assert_eq!(r.verdict(Area::P2p).map(|v| v.status), Some(Status::Ok));
    assert_eq!(
        r.verdict(Area::Gdr).map(|v| v.status),
        Some(Status::Unavailable)
    );
    let id = |s: &str| r.findings.iter().find(|f| f.id.as_str() == s);
    assert_eq!(
        id("gdr.no-rdma-device").map(|f| f.status),
        Some(Status::Unavailable)
    );
    assert_eq!(
        id("gds.nvidia-fs-missing").map(|f| f.status),
        Some(Status::Degraded)
    );
    // cuFile's handle registration is live-only: not run on a replay.
    assert!(r
        .findings
        .iter()
        .filter(|f| f.id.as_str() == "gds.handle-register-failed")
        .all(|f| f.status == Status::NotRun));
}
